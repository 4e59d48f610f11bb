"""How an attempt can end without a seal: the closed set of reasons.

A failed attempt is an expected event, not a bug: a backend *returns* an
:class:`~rollout_recovery.rollout.AttemptFailure` carrying a :class:`FailureReason`, with
its predicates (the controller branches on :meth:`FailureReason.is_retryable`; the
kinds classify a failure for whoever reports on them), so nobody compares reason
strings. A backend raises only for a bug or bad state, and that stops the run.

A bottom module, not ``rollout``'s: :class:`~rollout_recovery.errors.GenerationError`
carries a reason from deep inside an attempt to the backend's boundary, and the error
model sits below every room, so the reason's type must too (the values are the strings
the journal records; ``rollout`` re-exports the enum).

Three kinds of reason (every member is exactly one of them):

- *infra*: the machinery failed (a worker, a server, an actor, the clock, the process);
  the same attempt elsewhere may well succeed.
- *data*: the episode itself failed (the environment or the agent erred); the attempt
  produced nothing, and a new attempt samples again.
- *control*: the controller ended it (a cohort abandoned whole, a drain, a closed
  backend); nothing failed by itself.

Failures that *finish* are different: the attempt ran, but what a call produced is
unusable (a malformed server reply, a token outside the vocabulary, a staging write that
failed). Those are sealed as masked placeholders whose receipt says why
(``data_error:<reason>``); resending would get the same answer.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["FailureReason"]


class FailureReason(StrEnum):
    """Why an attempt ended without a seal (it is abandoned and its sibling retried)."""

    #: The controller's attempt deadline passed (a hung or very slow attempt).
    DEADLINE_EXCEEDED = "deadline_exceeded"
    #: The simulated worker running it crashed (every attempt on it fails at once).
    WORKER_CRASHED = "worker_crashed"
    #: The agent episode failed (the simulated environment's injected failure).
    ATTEMPT_FAILED = "attempt_failed"
    #: Every server the call was sent to failed (infra), past the redispatch budget.
    SERVER_UNAVAILABLE = "server_unavailable"
    #: No healthy server for the pool's wait budget.
    NO_LIVE_SERVER = "no_live_server"
    #: The Ray actor running it died (killed, crashed, missed a deadline or a ping).
    ACTOR_DIED = "actor_died"
    #: No Ray actor with the current weights for the pool's wait budget.
    NO_LIVE_ACTOR = "no_live_actor"
    #: A live Ray actor raised (a data shard that did not answer, a fenced write, a bug in
    #: the actor): from the driver, the machinery failed; the actor keeps serving.
    ACTOR_ERROR = "actor_error"
    #: The backend was closed under it (the run is stopping).
    BACKEND_CLOSED = "backend_closed"
    #: A restore found it in flight: the process that ran it is gone.
    RESTART = "restart"
    #: A prompt-group cohort is abandoned whole when any of its siblings failed.
    COHORT = "cohort"
    #: The run is draining: it was not going to finish within the grace period.
    DRAIN = "drain"
    #: Launched generation servers did not come up. Never an attempt's reason: the fleet
    #: raises it (as a ``GenerationError``) before any attempt runs, and the run stops.
    SERVER_START_FAILED = "server_start_failed"

    def is_retryable(self) -> bool:
        """Whether the sibling is worth another round: all but a closed backend, which can
        generate nothing more (the controller stops the run instead of spending rounds)."""
        return self is not FailureReason.BACKEND_CLOSED

    def is_infra(self) -> bool:
        """The machinery failed (a worker, a server, an actor, the clock, the process)."""
        return self in _INFRA

    def is_data(self) -> bool:
        """The episode itself failed (the environment or the agent), not the machinery."""
        return self is FailureReason.ATTEMPT_FAILED


_INFRA = frozenset(
    {
        FailureReason.DEADLINE_EXCEEDED,
        FailureReason.WORKER_CRASHED,
        FailureReason.SERVER_UNAVAILABLE,
        FailureReason.NO_LIVE_SERVER,
        FailureReason.ACTOR_DIED,
        FailureReason.NO_LIVE_ACTOR,
        FailureReason.ACTOR_ERROR,
        FailureReason.RESTART,
        FailureReason.SERVER_START_FAILED,
    }
)
