"""The audit trail: the run's history (the journal) and its per-step metrics.

``events.jsonl`` is the write-ahead journal (``_journal``): every record of the run,
checksummed, never cut back; a restore replays it. ``metrics.jsonl`` is a plain JSON-lines
sink, one line per trained step: a restore cuts it back to its checkpoint, because the
steps trained after the checkpoint are trained again and logged again.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from .._durable import PRIVATE_FILE_MODE
from .._lifecycle import Resource
from ..errors import CheckpointDirectoryError, RunNotResumableError, StorageFullError
from ..rundir import CheckpointStore, RunDirectory
from ._journal import JournalCorruptError, JournalStream, JournalWriter
from ._trail_reader import read_json_lines, read_records, version_problems
from .records import HistoryRecord

__all__ = ["AuditTrail", "strict_json_line"]


def _plain_number(value: object) -> object:
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    raise NotImplementedError(f"cannot write a {type(value).__name__} to the metrics")


# msgspec writes NaN and infinities as null: strict JSON by construction.
_ENCODER = msgspec.json.Encoder(enc_hook=_plain_number)

# One name for the append syscall, so a test can make the disk "fill up" mid-line.
_write = os.write


def strict_json_line(record: Mapping[str, Any]) -> bytes:
    """One strict-JSON line (non-finite floats become null)."""
    return _ENCODER.encode(dict(record)) + b"\n"


def _restore_remedy(path: Path, needed: int | None = None) -> str:
    length = f" (it must hold at least {needed} bytes of whole records)" if needed else ""
    return (
        f"Nothing was changed. Restore {path.name} from a backup{length}, or start a new run "
        "in another directory."
    )


class AuditTrail(Resource):
    """Appends history records to the journal and metrics lines to their sink."""

    def __init__(self, run: RunDirectory) -> None:
        self._run = run
        self.journal = JournalWriter(run.events)
        self._metrics_fd = os.open(
            run.metrics, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE_MODE
        )

    def close(self) -> None:
        self.journal.close()
        if self._metrics_fd >= 0:
            os.close(self._metrics_fd)
            self._metrics_fd = -1

    # -- the history -------------------------------------------------------------------

    def append(self, record: HistoryRecord) -> int:
        """Append one record to the journal; returns the position after it."""
        return self.journal.append(record)

    def append_all(self, records: Sequence[HistoryRecord]) -> int:
        """Append one cut's records with a single write (all or none survive a kill)."""
        return self.journal.append_all(records)

    async def flush(self) -> None:
        """Every record appended so far is durable when this returns (group commit)."""
        await self.journal.flush()

    @property
    def position(self) -> int:
        return self.journal.position

    # -- metrics -----------------------------------------------------------------------

    def metrics(self, values: Mapping[str, Any]) -> None:
        line = strict_json_line(values)
        if _write(self._metrics_fd, line) != len(line):
            raise StorageFullError(
                f"appending to {self._run.metrics.name}", filename=str(self._run.metrics)
            )

    @property
    def metrics_path(self) -> Path:
        return self._run.metrics

    @property
    def metrics_position(self) -> int:
        return os.fstat(self._metrics_fd).st_size

    def truncate_metrics(self, length: int) -> None:
        """Cut the metrics back to a checkpoint's length (its later steps run again)."""
        current = self.metrics_position
        if length > current:
            raise CheckpointDirectoryError(
                f"{self._run.metrics.name} is {current} bytes but the checkpoint recorded "
                f"{length}: the metrics lost lines the checkpoint had synced",
                directory=str(self._run.root),
            )
        os.ftruncate(self._metrics_fd, length)
        os.fsync(self._metrics_fd)

    # -- both --------------------------------------------------------------------------

    def marks(self) -> dict[str, int]:
        """Both files' lengths by name: what a checkpoint taken now includes."""
        return {
            self._run.events.name: self.journal.position,
            self._run.metrics.name: self.metrics_position,
        }

    def start_over(self) -> None:
        """Empty both files: a fresh run (no checkpoint, no earlier work) begins."""
        self.journal.truncate(0)
        self.truncate_metrics(0)

    def sync(self) -> None:
        self.journal.sync()
        os.fsync(self._metrics_fd)

    # -- reading back (no trail open) --------------------------------------------------

    @staticmethod
    def read_history(run: RunDirectory) -> list[HistoryRecord]:
        """Every verified record of ``run``'s journal, in order; a torn tail is left out.

        Raises :class:`~rollout_recovery.errors.TrailLineError` for a history of another
        version and ``JournalCorruptError`` for damage before the end (both
        ``InvalidStateError``, naming ``file:line``).
        """
        return [record for _, record in read_records(run.events)]

    @staticmethod
    def stream_history(
        run: RunDirectory, *, events: Collection[str] | None = None
    ) -> Iterator[HistoryRecord]:
        """The verified records of ``run``'s journal, one at a time (memory follows the
        longest record, not the journal); with ``events``, only records of those types
        are decoded and yielded, the others only checksummed. A torn tail is left out;
        damage before the end raises ``JournalCorruptError`` when it is reached."""
        for entry in JournalStream(run.events).entries(events=events):
            yield entry.record

    @staticmethod
    def require_synced_history(run: RunDirectory, store: CheckpointStore) -> None:
        """Refuse, changing nothing, a journal that lost what a committed checkpoint
        synced, that is damaged anywhere before its end, or that was written by a history
        version this one does not read: ``RunNotResumableError``.

        Each committed checkpoint's manifest records the length of ``events.jsonl`` it
        synced before it committed, and the journal is only ever cut back to a torn tail
        after all of them: a journal shorter than any lost synced records, whichever
        checkpoint a restore would choose (falling back to an older one would journal
        anew, under new ids, what the lost records had acknowledged). Then every line is
        checksummed, streamed, nothing decoded (``docs/benchmarks.md``: its speed):
        damage with whole records after it is not a crash's work, and a torn tail may
        start only after every synced position. Run it before anything is trained: a
        rerun would find the same. (``metrics.jsonl`` is cut back by every restore to its
        checkpoint's length, so only the checkpoint restored can vouch for it:
        :meth:`require_synced_metrics`.)
        """
        synced: list[tuple[int, str]] = []
        for committed in store.committed():
            try:
                marks = store.read_marks(committed)
            except CheckpointDirectoryError:
                continue  # a damaged manifest vouches for nothing; the restore reports it
            if run.events.name in marks:
                synced.append((marks[run.events.name], committed.name))
        size = run.events.stat().st_size if run.events.exists() else 0
        longer = sorted(item for item in synced if item[0] > size)
        if longer:
            raise RunNotResumableError(
                f"{run.events.name} is {size} bytes, shorter than committed checkpoints "
                "synced it to ("
                + ", ".join(f"{name} at byte {position}" for position, name in longer)
                + "): the history lost records that were synced",
                remedy=_restore_remedy(run.events, longer[-1][0]),
            )
        if not run.events.exists():
            return
        whole = JournalStream(run.events)
        try:
            # Every line checksummed; only the run_started records decoded, for the
            # history versions the run was written under.
            started = list(whole.entries(events={"run_started"}))
        except JournalCorruptError as error:
            raise RunNotResumableError(str(error), remedy=_restore_remedy(run.events)) from error
        unreadable = version_problems(started, run.events.name)
        if unreadable:
            raise RunNotResumableError(
                unreadable[0],
                remedy="Nothing was changed. Resume it with the rollout-recovery that wrote "
                "it, or start a new run in another directory.",
            )
        newest = max(synced, default=None)
        if newest is not None and whole.end < newest[0]:
            position, name = newest
            raise RunNotResumableError(
                f"{run.events.name}:{whole.end_line} (byte {whole.end}) is damaged "
                f"({whole.torn_reason}) from there to its end, before byte {position}, which "
                f"{name} synced: the history lost records that were synced",
                remedy=_restore_remedy(run.events, position),
            )

    @staticmethod
    def require_synced_metrics(run: RunDirectory, checkpoint: str, length: int) -> None:
        """Refuse, changing nothing, metrics shorter than the ``length`` the checkpoint to
        restore synced them to (its restore cuts them back to it): ``RunNotResumableError``."""
        size = run.metrics.stat().st_size if run.metrics.exists() else 0
        if size < length:
            raise RunNotResumableError(
                f"{run.metrics.name} is {size} bytes, shorter than the {length} bytes "
                f"{checkpoint} synced: the metrics lost lines that were synced",
                remedy=_restore_remedy(run.metrics, length),
            )

    @staticmethod
    def read_metrics(run: RunDirectory) -> list[dict[str, Any]]:
        """Every line of ``run``'s metrics, in order.

        Raises :class:`~rollout_recovery.errors.TrailLineError` for a line that is not a
        JSON object.
        """
        return list(AuditTrail.stream_metrics(run))

    @staticmethod
    def stream_metrics(run: RunDirectory) -> Iterator[dict[str, Any]]:
        """The lines of ``run``'s metrics one at a time (see :meth:`read_metrics`)."""
        for _, values in read_json_lines(run.metrics):
            yield values
