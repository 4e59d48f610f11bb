"""Errors cross process boundaries (Ray actors, subprocesses) as themselves."""

from __future__ import annotations

import pickle

import pytest

from rollout_recovery import errors
from rollout_recovery.rollout import FailureReason

CASES = [
    errors.MissingRowError("canonical", ["g1_g0"]),
    errors.FencedWriterError("gen-3", "rollout_staging"),
    errors.InvalidArgumentError("bad", path="$.x"),
    errors.InvalidRowError("token_ids must be 1-D", key="k", field="token_ids"),
    errors.GenerationError(FailureReason.ACTOR_DIED, "gone", worker="gen-1"),
    errors.ActorPoolExhaustedError("budget spent"),
    errors.LivenessError("a shard", 5.0),
    errors.DataPlaneBusyError("busy", file="f", operation="put", holder_pids=[7]),
    errors.StorageFullError("staging a row", filename="/runs/x/dataplane.sqlite"),
    errors.NotARegularFileError(22, "not a regular file", "/runs/x/fifo"),
    errors.RewardFunctionError("reward_raised", "ZeroDivisionError: division by zero"),
]


@pytest.mark.parametrize("error", CASES, ids=lambda e: type(e).__name__)
def test_an_error_survives_pickling_with_its_attributes(error: Exception) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert copy.__dict__ == error.__dict__
    assert copy.args == error.args
    if isinstance(error, OSError):
        assert (copy.errno, copy.strerror, copy.filename) == (
            error.errno,
            error.strerror,
            error.filename,
        )
