"""The project's exception hierarchy.

Every error the library raises on purpose derives from :class:`RolloutRecoveryError` *and*
from the builtin type the seed contract names (``ValueError``, ``TypeError`` or
``RuntimeError``), so code written against NeMo-RL's ledger keeps catching what it caught,
while callers that need to branch can catch a project class and read structured fields
instead of parsing message text.

Two class attributes say what a caller may do next: ``fatal`` (the run cannot go on: a
group's publication outcome is unknown, a checkpoint is unsafe, sealed staging rows are
lost, a cut was used after its section) and ``retryable`` (nothing changed; the same call
may simply be repeated).

Where an error is located, it says so in one way: ``path`` is a rooted JSON-style path into
the value at fault (``$.groups[3].siblings[0].attempts[1].status``; ``$`` is the state,
file payload or call argument being checked), ``file`` the file it came from. Messages never
spell the location; ``__str__`` appends it once, as ``message (at $.path in file)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from ._messages import format_keys
from ._outcomes import FailureReason

__all__ = [
    "ActorPoolExhaustedError",
    "BareStringError",
    "BarrierNestingError",
    "BarrierTimeoutError",
    "CheckpointDirectoryError",
    "CheckpointUnsafeError",
    "ClosedResourceError",
    "ConfigError",
    "DataPlaneBusyError",
    "DataPlaneClosedError",
    "DeadCutError",
    "FencedWriterError",
    "FinalizationUnknownError",
    "GenerationError",
    "InvalidArgumentError",
    "InvalidArgumentTypeError",
    "InvalidOperationError",
    "InvalidRowError",
    "InvalidStateError",
    "InvalidStateTypeError",
    "InvalidTransitionError",
    "JobMismatchError",
    "LivenessError",
    "MissingRowError",
    "NoValidRowsError",
    "NotARegularFileError",
    "NotARunDirectoryError",
    "RewardFunctionError",
    "RolloutRecoveryError",
    "RunDirectoryLockedError",
    "RunNotResumableError",
    "SidecarFormatError",
    "StagingInventoryError",
    "StepShortfallError",
    "StorageFullError",
    "TrailLineError",
    "TrainingDivergedError",
    "UnknownGroupError",
    "UnknownMutationKindError",
]


class RolloutRecoveryError(Exception):
    """Root of every error raised on purpose by ``rollout_recovery``.

    ``fatal``: the run cannot go on and must stop (and resume from its last checkpoint).
    ``retryable``: nothing changed and the same call may be repeated as it is.
    ``rerun_resumes``: a run stopped by it continues when the same command runs again
    (False where the rerun would stop the same way: the message says what to change).
    """

    fatal: ClassVar[bool] = False
    retryable: ClassVar[bool] = False
    rerun_resumes: ClassVar[bool] = True

    def __reduce__(self) -> tuple[Any, ...]:
        # Picklable whatever the subclass's __init__ takes (the default reduce calls
        # cls(*args)): an error raised in a Ray actor or another process arrives as itself,
        # attributes included.
        args = self.args
        if isinstance(self, OSError) and self.filename is not None:
            args = (*args, self.filename)  # OSError keeps it in a slot, not in args
        return (_rebuild_error, (type(self), args, dict(self.__dict__)))


def _rebuild_error(
    cls: type[RolloutRecoveryError], args: tuple[Any, ...], state: dict[str, Any]
) -> RolloutRecoveryError:
    error: RolloutRecoveryError = cls.__new__(cls, *args)
    if isinstance(error, OSError):
        # errno, strerror and filename live in slots that OSError.__init__ fills (our
        # subclasses' own __init__ take other arguments, so it is called directly).
        OSError.__init__(error, *args)
    else:
        error.args = args
    error.__dict__.update(state)
    return error


def _located(message: str, path: str | None, file: str | None) -> str:
    where = " ".join(
        part for part in (f"at {path}" if path else "", f"in {file}" if file else "") if part
    )
    return f"{message} ({where})" if where else message


class _LocatedError(RolloutRecoveryError):
    """An error with a ``path`` (rooted JSON-style) and a ``file``, rendered by ``__str__``.

    ``message`` is the text without its location.
    """

    def __init__(self, message: str, *, path: str | None = None, file: str | None = None) -> None:
        if path is not None and not path.startswith("$"):
            raise InvalidArgumentError(f"error path must be rooted at '$', got {path!r}")
        super().__init__(message)
        self.message = message
        self.path = path
        self.file = file

    def __str__(self) -> str:
        return _located(self.message, self.path, self.file)


class InvalidTransitionError(RolloutRecoveryError, ValueError):
    """A ledger transition was refused; the ledger is unchanged.

    ``group_id`` names the group at fault when one is known.
    """

    def __init__(self, message: str, *, group_id: str | None = None) -> None:
        super().__init__(message)
        self.group_id = group_id


class UnknownGroupError(InvalidTransitionError):
    """The named group is not owned by the ledger."""


class InvalidStateError(_LocatedError, ValueError):
    """Persisted state (a state dict, a sidecar, a file) breaks the schema or an invariant.

    ``path`` locates the offending field, for example
    ``$.groups[3].siblings[0].attempts[1].status``, and ``file`` the file, when known.
    """


class SidecarFormatError(InvalidStateError):
    """The bytes are not a readable sidecar file: unknown format, truncated, corrupted.

    Raised before any schema check runs, so no state was produced. A caller that treats
    every bad checkpoint alike catches :class:`InvalidStateError`, while a caller that
    must tell "cannot decode" (``rollout-recovery validate`` exits 2) from "decoded but
    breaks the schema" (exit 1) catches this subclass first. ``path`` names the envelope
    field at fault when one is known, else it is ``None``.
    """


class TrailLineError(InvalidStateError):
    """A line of a run's JSON-lines file (journal, metrics) that is not what it must be
    (damaged or hand-edited); ``file`` names the file."""


class InvalidStateTypeError(_LocatedError, TypeError):
    """Persisted state has the wrong container type where the seed raises ``TypeError``."""


class InvalidArgumentError(_LocatedError, ValueError):
    """A call was refused for a bad argument value; nothing changed.

    ``path`` locates the offending part inside the argument when it is structured
    (``$.weight_version``, ``$.manifest[2].staging_key``).
    """


class InvalidArgumentTypeError(_LocatedError, TypeError):
    """A call was refused for an argument of the wrong type; nothing changed."""


class InvalidOperationError(RolloutRecoveryError, RuntimeError):
    """A call the object's current state does not allow (not a bad argument); nothing changed.

    For example restoring into a non-empty ledger, or reading the prompt of a group whose
    prompt was not rehydrated.
    """


class ClosedResourceError(InvalidOperationError, ValueError):
    """An object was used after ``close()`` (a ``ValueError``, as for a closed file)."""


class FinalizationUnknownError(RolloutRecoveryError, RuntimeError):
    """Publication failed after the canonical rows were submitted; fatal.

    The group is FINALIZATION_UNKNOWN, which blocks every checkpoint: the run must stop and
    resume from its last checkpoint. ``group_id`` names the group; the failure that caused
    it is ``__cause__``.
    """

    fatal = True

    def __init__(self, message: str, *, group_id: str) -> None:
        super().__init__(message)
        self.group_id = group_id


class DeadCutError(RolloutRecoveryError, RuntimeError):
    """A ``DataPlaneMutationCut`` was used after its barrier section exited; fatal."""

    fatal = True


class BarrierNestingError(RolloutRecoveryError, RuntimeError):
    """A task tried to open a barrier section while it already holds one."""


class CheckpointUnsafeError(RolloutRecoveryError, RuntimeError):
    """The ledger holds groups whose publication outcome is ambiguous; nothing was saved.

    Fatal: the run must stop and resume from its last checkpoint.
    """

    fatal = True

    def __init__(self, message: str, *, group_ids: list[str]) -> None:
        super().__init__(message)
        self.group_ids = group_ids


class UnknownMutationKindError(InvalidArgumentError):
    """``barrier.mutation(kind=...)`` named a kind outside ``CHECKPOINT_MUTATION_KINDS``."""


class MissingRowError(RolloutRecoveryError, KeyError):
    """A data-plane ``get`` named keys the partition does not hold; nothing was returned.

    ``partition`` and ``keys`` (every missing key, in request order) are structured fields.
    """

    def __init__(self, partition: str, keys: Sequence[str]) -> None:
        self.partition = partition
        self.keys = list(keys)
        super().__init__(
            f"data plane partition {partition!r} has no row for keys {format_keys(self.keys)}"
        )

    def __str__(self) -> str:
        # KeyError.__str__ would repr() the message and wrap it in quotes.
        return str(self.args[0])


class InvalidRowError(RolloutRecoveryError, ValueError):
    """A row (on ``put``) or a stored row (on ``get`` / ``restore``) breaks the row format.

    ``key`` names the row and ``field`` the offending field (for example ``token_ids`` or
    ``metadata['calls'][2]``) when they are known.
    """

    def __init__(self, message: str, *, key: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.field = field


class DataPlaneClosedError(RolloutRecoveryError, RuntimeError):
    """A data-plane store was used after ``close()``."""


class StagingInventoryError(RolloutRecoveryError, RuntimeError):
    """The ledger owns staging rows the data plane does not hold: sealed work was lost.

    ``missing`` lists every missing staging key. Nothing was deleted. Fatal.
    """

    fatal = True

    def __init__(self, missing: Sequence[str]) -> None:
        self.missing = list(missing)
        super().__init__(
            "rollout-recovery ownership references staging rows missing from the data "
            f"plane: missing={format_keys(self.missing)}"
        )


class BarrierTimeoutError(RolloutRecoveryError, TimeoutError):
    """A barrier section could not be entered before its deadline; nothing was held.

    ``section`` is ``"mutation"`` or ``"checkpoint"``; ``kind`` the mutation kind (None for
    a checkpoint); ``timeout`` the deadline in seconds.
    """

    def __init__(self, *, section: str, kind: str | None, timeout: float) -> None:
        what = f"{section} section" + (f" of kind {kind!r}" if kind else "")
        super().__init__(
            f"could not enter the data-plane barrier's {what} within {timeout:g} s; "
            "nothing is held and the barrier is unchanged"
        )
        self.section = section
        self.kind = kind
        self.timeout = timeout


class DataPlaneBusyError(RolloutRecoveryError, RuntimeError):
    """Another connection held the data-plane store's lock past the busy timeout.

    Nothing changed: the call can be retried as it is (``retryable`` is True). ``file`` is
    the store file, ``operation`` the call that waited, and ``holder_pids`` the processes
    holding a write lock on the store when the operating system can say (Linux
    ``/proc/locks``), else empty.
    """

    retryable = True

    def __init__(
        self, message: str, *, file: str, operation: str, holder_pids: Sequence[int] = ()
    ) -> None:
        super().__init__(message)
        self.message = message
        self.file = file
        self.operation = operation
        self.holder_pids = list(holder_pids)

    def __str__(self) -> str:
        return _located(self.message, None, self.file)


class NotARegularFileError(RolloutRecoveryError, OSError):
    """A path that must be read as a file is a FIFO, a device, a socket or a directory.

    Refused before anything is read, so a FIFO never blocks the reader. An ``OSError``
    (``errno`` EINVAL, ``filename`` set), as any other file that cannot be read.
    """


class BareStringError(InvalidArgumentTypeError):
    """A single ``str`` (or bytes) was passed where a collection of ids or keys belongs.

    Iterating it would address one-character ids, so it is refused; wrap it in a list.
    """


class GenerationError(RolloutRecoveryError, RuntimeError):
    """The generation side failed: raised deep inside one attempt, or at a fleet's start.

    Inside an attempt (a model client, a worker pool) it is how a failure leaves the
    frames it happened in; the backend's boundary (``rollout.run_episode``, the pools)
    turns it into an ``AttemptFailure`` value, and the controller abandons the attempt and
    retries the sibling. ``reason`` is a :class:`FailureReason` (``worker_crashed``,
    ``no_live_server``, ...), recorded in the audit trail; ``worker`` names the worker
    when known. Raised *out of* a backend it breaks the backend protocol and stops the
    run. It also stops the run when a fleet cannot start its servers
    (``server_start_failed``) and when the controller finds its backend closed under it
    (``backend_closed``); a rerun resumes.
    """

    def __init__(self, reason: FailureReason, message: str, *, worker: str | None = None) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.worker = worker


class RewardFunctionError(RolloutRecoveryError, ValueError):
    """A reward function of one's own (``[reward] function``) failed on one completion:
    it raised, returned NaN, infinity or no number, or ran past ``[reward] timeout_s``.

    Raised by an episode's grading; ``rollout.run_episode`` seals that attempt as a failed
    one whose receipt says why (``data_error:<reason>``, ``reason`` being
    ``reward_raised``, ``reward_not_finite``, ``reward_not_a_number`` or
    ``reward_timeout``): the sibling trains as a masked placeholder and the run goes on.
    ``detail`` says what the function did (the exception, the value it returned).
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(reason, detail)
        self.reason = reason
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}"


class ConfigError(RolloutRecoveryError, ValueError):
    """A job configuration was refused before anything started; ``path`` names the field."""

    rerun_resumes = False

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message if path is None else f"{path}: {message}")
        self.path = path


class CheckpointDirectoryError(RolloutRecoveryError, RuntimeError):
    """A checkpoint directory is incomplete, corrupt or unreadable; ``directory`` names it."""

    def __init__(self, message: str, *, directory: str | None = None) -> None:
        super().__init__(message if directory is None else f"{directory}: {message}")
        self.directory = directory


class JobMismatchError(RolloutRecoveryError, ValueError):
    """An output directory holds another job's checkpoints; ``differences`` lists the fields."""

    rerun_resumes = False

    def __init__(self, message: str, *, differences: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.differences = list(differences)


class LivenessError(RolloutRecoveryError, RuntimeError):
    """A bounded wait ran out: ``waited_for`` says what, ``seconds`` how long."""

    def __init__(self, waited_for: str, seconds: float) -> None:
        super().__init__(f"gave up waiting for {waited_for} after {seconds:g} s")
        self.waited_for = waited_for
        self.seconds = seconds


class StepShortfallError(RolloutRecoveryError, RuntimeError):
    """Too many prompts of one step were dropped for it to train; the run stops.

    Raised before the drop that would cause it is recorded, so no checkpoint ever holds a
    step that can no longer train; the message says which operational setting lets the
    run continue.
    """

    rerun_resumes = False

    def __init__(
        self, *, step: int, available: int, required: int, per_step: int | None = None
    ) -> None:
        if per_step and available > 0:
            remedy = (
                f"rerun with job.min_step_fraction <= {available / per_step:g} (an operational "
                "setting) to train it with fewer groups, or with more retry.max_rounds"
            )
        else:
            remedy = "rerun with more retry.max_rounds (an operational setting)"
        super().__init__(
            f"step {step} can train at most {available} groups but needs at least {required} "
            "(job.min_step_fraction): too many of its prompts were dropped; " + remedy
        )
        self.step = step
        self.available = available
        self.required = required


class NotARunDirectoryError(RolloutRecoveryError, ValueError):
    """A path given as a run directory holds no rollout-recovery job."""

    rerun_resumes = False


class StorageFullError(RolloutRecoveryError, OSError):
    """The disk is full (ENOSPC): the run stops; free space and rerun to resume.

    Nothing half-written is kept: the store rolled the write back, and the previous
    checkpoint is intact.
    """

    def __init__(self, what: str, *, filename: str | None = None) -> None:
        import errno

        super().__init__(errno.ENOSPC, f"no space left on device while {what}", filename)


class FencedWriterError(RolloutRecoveryError, PermissionError):
    """A data-plane write from a fenced writer (a generation actor declared dead) was
    refused: whatever it still had in flight must never land. ``writer`` names it."""

    def __init__(self, writer: str, partition: str) -> None:
        super().__init__(f"writer {writer!r} is fenced: its write to {partition!r} was refused")
        self.writer = writer
        self.partition = partition


class ActorPoolExhaustedError(RolloutRecoveryError, RuntimeError):
    """No live generation actor is left and none could be started: the run stops instead
    of waiting forever. ``detail`` says what the last start attempt hit."""

    fatal = True

    def __init__(self, detail: str) -> None:
        super().__init__(f"no live generation actor is left and none could be started: {detail}")
        self.detail = detail


class RunDirectoryLockedError(RolloutRecoveryError, RuntimeError):
    """Another live job holds the run directory's lock; nothing was written.

    ``pid`` is the holder's process id when its lock file names one.
    """

    rerun_resumes = False

    def __init__(self, message: str, *, pid: int | None, directory: str) -> None:
        super().__init__(message)
        self.pid = pid
        self.directory = directory


class RunNotResumableError(RolloutRecoveryError, RuntimeError):
    """The run in a directory cannot continue as it is: rerunning the same command would
    fail the same way. ``reason`` says why, ``remedy`` what would let it continue."""

    rerun_resumes = False

    def __init__(self, reason: str, *, remedy: str) -> None:
        super().__init__(f"this run cannot continue: {reason}. {remedy}")
        self.reason = reason
        self.remedy = remedy


class NoValidRowsError(RolloutRecoveryError, RuntimeError):
    """Several steps in a row trained no valid row: every row was a masked placeholder,
    or the trainer refused the step (``refused`` says why: another model's logprobs).

    ``reasons`` counts the placeholders' rejection reasons in the last step.
    """

    rerun_resumes = False

    def __init__(
        self,
        *,
        steps: int,
        last_step: int,
        reasons: dict[str, int],
        refused: str | None = None,
    ) -> None:
        shown = ", ".join(f"{reason} x{count}" for reason, count in sorted(reasons.items()))
        why = (
            f"the last was refused: {refused}"
            if refused is not None
            else f"every row was a masked placeholder ({shown or 'no reason recorded'})"
        )
        super().__init__(
            f"{steps} steps in a row (through step {last_step}) trained no valid row: {why}. "
            "The generation side produces nothing usable: check the servers (their replies, "
            "vocabulary and weights); job.max_steps_without_valid_rows sets how many such "
            "steps are allowed"
        )
        self.steps = steps
        self.last_step = last_step
        self.reasons = reasons
        self.refused = refused


class TrainingDivergedError(RolloutRecoveryError, RuntimeError):
    """Too many train steps in a row had a non-finite loss or gradient; fatal.

    Each of those steps was skipped (parameters and optimizer state untouched), so the
    weights are still those of the last applied update, but training is making no progress
    and a resume replays the same steps. ``skipped_in_a_row`` counts the skipped steps,
    this one included; ``weight_version`` is the trainer's version when it gave up;
    ``reason`` says what was not finite in this step.
    """

    fatal = True
    rerun_resumes = False

    def __init__(self, *, skipped_in_a_row: int, weight_version: int, reason: str) -> None:
        super().__init__(
            f"training diverged: {skipped_in_a_row} train steps in a row (the last at weight "
            f"version {weight_version}) were skipped because their update was not finite; "
            f"this step: {reason}. The weights are those of the last applied update, and "
            "resuming from the last checkpoint replays the same steps. Check the behaviour "
            "logprobs the generation servers report (NaN or overflowing values) and the "
            "advantages, lower policy.learning_rate, or allow more skipped steps in a row (the "
            "trainer's diverged_after)"
        )
        self.skipped_in_a_row = skipped_in_a_row
        self.weight_version = weight_version
        self.reason = reason
