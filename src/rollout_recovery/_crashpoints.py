"""Named crash points: the places where a test can SIGKILL the real job on purpose.

Recovery code is only trustworthy if the process really dies at the awkward instants
(files written but not committed, committed but not renamed, ...), so the job calls
:func:`crash_point` at each of them. Unarmed it costs a set lookup and a cached check. Armed
through ``ROLLOUT_RECOVERY_CRASH_AT=name`` (or ``name:N`` for the N-th time that point is
reached in this process), it writes ``crash point <name> fired`` to stderr and sends
itself SIGKILL: no ``finally``, no ``atexit``, no buffered writes flushed, exactly what a
power cut or the OOM killer leaves behind.

The variable is read once per process, on first use, and validated then: a typo in a test's
environment must fail loudly rather than silently never crash. Call
:func:`armed_crash_point` at startup to surface that error before any work starts.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from .errors import ConfigError, InvalidArgumentError

__all__ = [
    "CRASH_AT_ENV",
    "CRASH_POINTS",
    "armed_crash_point",
    "crash_point",
    "parse_crash_at",
    "reset_crash_points_for_tests",
]

CRASH_AT_ENV = "ROLLOUT_RECOVERY_CRASH_AT"

CRASH_POINTS: frozenset[str] = frozenset(
    {
        # Checkpoint files written and fsynced, COMMITTED marker not yet written.
        "checkpoint.before_committed",
        # COMMITTED written, the temporary directory not yet renamed to step_NNNNNN.
        "checkpoint.before_rename",
        # step_NNNNNN in place, LATEST not yet moved to it.
        "checkpoint.before_latest",
        # Canonical rows put, the ledger group not yet discarded.
        "finalize.after_put",
        # A call's rows staged, not yet acknowledged to the worker.
        "capture.before_ack",
        # In the middle of a restore.
        "restore.mid",
        # Training step done, its sample_clears not yet applied.
        "train.before_clear",
        # A journal record written (it survives the process), not yet fsynced.
        "journal.after_append",
        # A journal fsync done, its waiters not yet told.
        "journal.after_fsync",
        # A torn journal tail found, not yet cut.
        "journal.before_cut",
        # Inside a checkpoint's hold: the journal position taken, the hold not released.
        "snapshot.in_hold",
        # A checkpoint captured (its hold released, the trainer's state copied to memory),
        # nothing of it encoded or written yet: in the background, the run trains on.
        "checkpoint.captured",
        # A checkpoint's snapshot built from the journal, its files not yet written.
        "snapshot.before_write",
        # Halfway through replaying the journal after a snapshot (a restore).
        "replay.mid",
        # A launched vLLM server of the job before proven this run's, its lease not yet
        # handed over to the rerun (vllm/_adoption.py).
        "adopt.before_handover",
        # A vLLM server loaded a pushed version, still paused and named "loading".
        "vllm.push_loaded",
        # A rerun handed its command to the warm standby (cli/_standby_link.py), the
        # child running it; the rerun not yet waiting for it.
        "standby.after_handover",
        # The standby proved a request fit, its child not yet forked (cli/_standby.py).
        "standby.before_fork",
        # The standby's child took the rerun's command over, the job not yet started.
        "standby.child_started",
    }
)

# Parsed once per process (``_parsed``), because the environment of a running job does not
# change and re-parsing on every hit would be waste; the lock keeps the hit count exact
# when points are reached from worker threads.
_lock = threading.Lock()
_parsed = False
_armed: tuple[str, int] | None = None
_hits = 0


def parse_crash_at(value: str) -> tuple[str, int] | None:
    """Parse a ``ROLLOUT_RECOVERY_CRASH_AT`` value: ``name`` or ``name:N`` (N >= 1).

    An empty (or blank) value means unarmed (``None``). Raises
    :class:`~rollout_recovery.errors.ConfigError` (a ``ValueError``) for an unknown name or
    a count that is not a positive integer.
    """
    text = value.strip()
    if not text:
        return None
    name, separator, count_text = text.partition(":")
    name = name.strip()
    if name not in CRASH_POINTS:
        raise ConfigError(
            f"unknown crash point {name!r}; known crash points: {', '.join(sorted(CRASH_POINTS))}",
            path=CRASH_AT_ENV,
        )
    if not separator:
        return name, 1
    count_text = count_text.strip()
    # isdecimal() refuses signs, spaces and non-ASCII digits int() would accept.
    if not (count_text.isascii() and count_text.isdecimal()) or int(count_text) < 1:
        raise ConfigError(
            f"crash point count must be a positive integer, got {count_text!r} in {value!r}",
            path=CRASH_AT_ENV,
        )
    return name, int(count_text)


def _armed_locked() -> tuple[str, int] | None:
    global _parsed, _armed
    if not _parsed:
        # Cache only a successful parse: a bad value raises at every use, not just the first.
        _armed = parse_crash_at(os.environ.get(CRASH_AT_ENV, ""))
        _parsed = True
    return _armed


def armed_crash_point() -> tuple[str, int] | None:
    """The armed ``(name, N)`` of this process, or ``None``; raises ``ConfigError`` if invalid."""
    with _lock:
        return _armed_locked()


def crash_point(name: str) -> None:
    """Reached crash point ``name``: SIGKILL this process here if it is the armed hit.

    ``name`` must be one of :data:`CRASH_POINTS` (a ``ValueError`` otherwise), so a typo at
    a call site cannot leave a point that no test can arm.
    """
    if name not in CRASH_POINTS:
        raise InvalidArgumentError(
            f"crash_point({name!r}): not a registered crash point; "
            f"known crash points: {', '.join(sorted(CRASH_POINTS))}"
        )
    global _hits
    with _lock:
        armed = _armed_locked()
        if armed is None or armed[0] != name:
            return
        _hits += 1
        if _hits != armed[1]:
            return
        try:
            sys.stderr.write(f"crash point {name} fired\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            # A closed or broken stderr must not stop the crash: the crash is the test.
            pass
        os.kill(os.getpid(), signal.SIGKILL)
        # SIGKILL to oneself cannot be blocked or caught and is delivered before kill()
        # returns; this is a guard against an exotic platform, still without any cleanup.
        os._exit(128 + signal.SIGKILL)


def reset_crash_points_for_tests() -> None:
    """Forget the parsed variable and the hit count, so a test can re-arm in-process."""
    global _parsed, _armed, _hits
    with _lock:
        _parsed = False
        _armed = None
        _hits = 0
