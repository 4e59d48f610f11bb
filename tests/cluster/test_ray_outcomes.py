"""What crosses the Ray process boundary becomes the driver's outcome in one place, and the
pool returns its own failures as values (no Ray cluster is started here).

Before issue 16's item 5 the pool raised ``GenerationError("no_live_actor")``, a reason the
controller could not turn into a ``FailureReason``: the run stopped with a ``ValueError``
instead of retrying the sibling.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

pytest.importorskip("ray")  # the [ray] extra: the module imports it; no cluster is started

from cluster_support import add_actor, pool_without_ray
from ray.exceptions import RayActorError, RayTaskError

from rollout_recovery._clock import VirtualClockLoop
from rollout_recovery.capture import CaptureWriter, Receipt
from rollout_recovery.cluster._pool import RayGenerationBackend, _across_the_boundary
from rollout_recovery.control._config import config_from_builtins
from rollout_recovery.dataplane import MemoryDataPlane
from rollout_recovery.errors import GenerationError
from rollout_recovery.policy import NumpyGRPOTrainer, PolicySnapshot
from rollout_recovery.rollout import AttemptFailure, AttemptRequest, AttemptResult, FailureReason

pytestmark = [pytest.mark.ray, pytest.mark.slow]

WAIT_S = 30.0

REQUEST = AttemptRequest(
    group_id="g0", generation_index=1, rollout_id="g0_g1_a0", prompt={}, weight_version=0
)


def _timed_attempt(
    backend: RayGenerationBackend, before: Callable[[], None] = lambda: None
) -> tuple[AttemptResult | AttemptFailure, float]:
    """One attempt on a virtual clock (``before`` runs on the loop first): its outcome and
    how long it took."""

    async def main() -> tuple[AttemptResult | AttemptFailure, float]:
        before()
        started = asyncio.get_running_loop().time()
        outcome = await backend.run_attempt(REQUEST, CaptureWriter(MemoryDataPlane()))
        return outcome, asyncio.get_running_loop().time() - started

    loop = VirtualClockLoop(autojump=True)
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


def test_no_actor_with_the_current_weights_is_a_no_live_actor_failure() -> None:
    backend, weights = pool_without_ray(no_actor_wait_s=WAIT_S)
    backend._started = True  # the one actor below is the whole pool

    def one_stale_actor() -> None:
        add_actor(backend, "a0", version=0)
        # New weights whose push never lands: the only actor keeps version 0.
        backend.update_weights(1, PolicySnapshot(1, dict(weights.params)))

    outcome, waited = _timed_attempt(backend, one_stale_actor)
    assert isinstance(outcome, AttemptFailure), outcome
    assert outcome.reason is FailureReason.NO_LIVE_ACTOR
    assert outcome.reason.is_infra() and outcome.reason.is_retryable()
    assert (outcome.rollout_id, outcome.generation_index) == ("g0_g1_a0", 1)
    assert waited == pytest.approx(WAIT_S, abs=0.5)


def _result() -> AttemptResult:
    return AttemptResult(
        rollout_id=REQUEST.rollout_id,
        receipt=Receipt(rollout_id=REQUEST.rollout_id, manifest=(), capture_poisoned=True),
        reward=1.0,
        mask_sample=False,
        reward_checks=None,
        generated_tokens=3,
    )


def _raised_in_actor(cause: BaseException) -> RayTaskError:
    return RayTaskError("GenerationWorker.run_attempt", "Traceback: ...", cause)


def test_a_result_crosses_unchanged() -> None:
    result = _result()
    assert _across_the_boundary(REQUEST, "actor-7", result) is result


def test_a_returned_failure_is_stamped_with_the_actor_that_ran_it() -> None:
    """Even when it names a worker: inside every actor the simulated backend's one worker
    is ``worker-0``, so only the actor's name says where it failed."""
    failure = AttemptFailure(
        rollout_id=REQUEST.rollout_id,
        generation_index=1,
        reason=FailureReason.WORKER_CRASHED,
        detail="worker-0 crashed mid-episode",
        worker="worker-0",
    )
    stamped = _across_the_boundary(REQUEST, "actor-7", failure)
    assert isinstance(stamped, AttemptFailure) and stamped.worker == "actor-7"
    assert stamped.reason is FailureReason.WORKER_CRASHED
    assert stamped.detail == "worker-0 crashed mid-episode"


def test_a_generation_error_raised_in_the_actor_keeps_its_reason() -> None:
    error = _raised_in_actor(
        GenerationError(FailureReason.WORKER_CRASHED, "lost", worker="worker-0")
    )
    outcome = _across_the_boundary(REQUEST, "actor-7", error)
    assert isinstance(outcome, AttemptFailure)
    assert outcome.reason is FailureReason.WORKER_CRASHED and outcome.worker == "actor-7"


def test_any_other_exception_in_a_live_actor_is_an_actor_error_that_says_what_it_was() -> None:
    outcome = _across_the_boundary(REQUEST, "actor-7", _raised_in_actor(KeyError("shard-3")))
    assert isinstance(outcome, AttemptFailure)
    assert outcome.reason is FailureReason.ACTOR_ERROR and outcome.worker == "actor-7"
    assert outcome.reason.is_infra() and outcome.reason.is_retryable()
    assert outcome.detail.startswith("KeyError") and "shard-3" in outcome.detail


def test_the_actors_death_is_actor_died_but_a_shards_death_inside_it_is_not() -> None:
    died = _across_the_boundary(REQUEST, "actor-7", RayActorError())
    assert isinstance(died, AttemptFailure) and died.reason is FailureReason.ACTOR_DIED
    assert died.worker == "actor-7"
    # A task that raised a dead data shard's RayActorError: Ray raises a class deriving
    # from both; the generation actor itself lives.
    shard = _raised_in_actor(RayActorError()).as_instanceof_cause()
    assert isinstance(shard, RayActorError)
    outcome = _across_the_boundary(REQUEST, "actor-7", shard)
    assert isinstance(outcome, AttemptFailure) and outcome.reason is FailureReason.ACTOR_ERROR


def test_no_actor_wait_s_is_set_from_the_config() -> None:
    """Issue 25: ``[ray] no_actor_wait_s`` could not be set (a mirror settings class had
    the knob, the config had not); the pool now reads its own section."""
    config = config_from_builtins(
        {"generation": {"backend": "ray"}, "ray": {"no_actor_wait_s": 7.0}}
    )
    weights = NumpyGRPOTrainer(seed=0).weights()
    backend = RayGenerationBackend(
        config.ray,
        spec=None,  # type: ignore[arg-type]  # no actor is ever created here
        plane=None,  # type: ignore[arg-type]
        initial_weights=weights,
    )
    backend._started = True  # no actor at all: every attempt waits for one
    outcome, waited = _timed_attempt(backend)
    assert isinstance(outcome, AttemptFailure) and outcome.reason is FailureReason.NO_LIVE_ACTOR
    assert waited == pytest.approx(7.0, abs=0.5)
