"""How an attempt can end without a seal: the closed set of reasons.

A failed attempt is an expected event, not a bug: a backend raises
``GenerationError(reason)`` and the controller turns it into a failure value with a
:class:`FailureReason`, with the predicates the controller and the auditor branch on, so
nobody compares reason strings; any other exception out of a backend means a bug or bad
state and stops the run.

*Data* failures are different: the attempt finished, but what it produced is unusable
(a malformed server reply, a token outside the vocabulary, a staging write that failed).
Those are sealed as masked placeholders whose receipt says why
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
    #: The backend was closed under it (the run is stopping).
    BACKEND_CLOSED = "backend_closed"
    #: A restore found it in flight: the process that ran it is gone.
    RESTART = "restart"
    #: A prompt-group cohort is abandoned whole when any of its siblings failed.
    COHORT = "cohort"
    #: The run is draining: it was not going to finish within the grace period.
    DRAIN = "drain"

    def is_retryable(self) -> bool:
        """Whether the sibling is worth another round (all but a closing backend)."""
        return self is not FailureReason.BACKEND_CLOSED

    def is_infra(self) -> bool:
        """The machinery failed (a worker, a server, an actor, the clock), not the model."""
        return self is not FailureReason.ATTEMPT_FAILED
