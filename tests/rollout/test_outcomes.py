"""The closed set of failure reasons and the one conversion of a raised failure."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rollout_recovery.errors import GenerationError
from rollout_recovery.rollout import AttemptFailure, AttemptRequest, FailureReason

REQUEST = AttemptRequest(
    group_id="g3", generation_index=2, rollout_id="g3_g2_a1", prompt={}, weight_version=4
)

# Written out by hand, not derived from the predicates: a reason moved to another kind
# must change this table too.
INFRA = {
    "deadline_exceeded",
    "worker_crashed",
    "server_unavailable",
    "no_live_server",
    "actor_died",
    "no_live_actor",
    "actor_error",
    "restart",
    "server_start_failed",
}
DATA = {"attempt_failed"}
CONTROL = {"backend_closed", "cohort", "drain"}


def test_every_reason_is_exactly_one_kind() -> None:
    assert {r.value for r in FailureReason} == INFRA | DATA | CONTROL
    for reason in FailureReason:
        kinds = [reason.is_infra(), reason.is_data(), reason.value in CONTROL]
        assert kinds.count(True) == 1, reason
        assert reason.is_infra() == (reason.value in INFRA)
        assert reason.is_data() == (reason.value in DATA)


def test_only_a_closed_backend_is_not_worth_another_round() -> None:
    assert [r for r in FailureReason if not r.is_retryable()] == [FailureReason.BACKEND_CLOSED]


@given(reason=st.sampled_from(FailureReason), worker=st.none() | st.text(max_size=8))
def test_a_raised_failure_becomes_its_value(reason: FailureReason, worker: str | None) -> None:
    failure = AttemptFailure.from_error(REQUEST, GenerationError(reason, "lost", worker=worker))
    assert failure == AttemptFailure(
        rollout_id="g3_g2_a1",
        generation_index=2,
        reason=reason,
        detail="lost",  # the reason once, in its field
        worker=worker,
    )
    assert failure.reason is reason


def test_a_closed_backend_failure_names_the_backend() -> None:
    failure = AttemptFailure.closed(REQUEST, "HTTP")
    assert failure.reason is FailureReason.BACKEND_CLOSED
    assert failure.detail == "the HTTP backend is closed"
    assert (failure.rollout_id, failure.generation_index) == ("g3_g2_a1", 2)
