"""Crash-safe checkpoint directories: write a whole directory, then commit it by rename.

Layout under a run directory ``DIR``::

    DIR/checkpoints/step_000010/                   committed: its files + COMMITTED
    DIR/checkpoints/.tmp-step_000012-<hex>/        a save in progress (or killed mid-way)
    DIR/checkpoints/.replaced-step_000010-<hex>/   the previous step_000010 while a re-save
                                                   of that step swaps it out
    DIR/checkpoints/.trash-step_000004-<hex>/      a pruned checkpoint being deleted
    DIR/checkpoints/LATEST                         "step_000010\\n", a hint only

Why it is crash safe: a checkpoint is a candidate only once it sits under its final
``step_NNNNNN`` name *and* holds ``COMMITTED``, and both happen only after every file and
the marker are fsynced. ``COMMITTED`` is a JSON manifest with each file's size and sha256,
so a torn or flipped file is caught on load and the reader falls back to an older
checkpoint. Everything else (temporaries, dot-directories, ``LATEST``) is never trusted:
dot-names never match the ``step_*`` scan, and ``LATEST`` may lag one rename behind a
crash. Leftovers are removed by :meth:`CheckpointStore.remove_stale`, which every save runs
first (freeing the space a killed save used) and which a resuming job runs once its run is
accepted; before it chooses the newest checkpoint it runs only
:meth:`CheckpointStore.put_back_replaced`, which :meth:`CheckpointStore.undo_put_back`
undoes if the run is refused (a refused run changes nothing).

One writer per run directory: saves in one process are serialized by a lock, and two
processes must not share a run directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from .._crashpoints import crash_point
from .._durable import FileParts, atomic_write_bytes, fsync_directory, write_new_file
from ..errors import (
    CheckpointDirectoryError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    RolloutRecoveryError,
)
from ._layout import CHECKPOINT_FILES, CheckpointFiles

__all__ = [
    "CHECKPOINTS_DIRNAME",
    "COMMITTED_FILENAME",
    "LATEST_FILENAME",
    "MANIFEST_FORMAT",
    "MANIFEST_VERSION",
    "CheckpointStore",
    "CommittedCheckpoint",
    "LoadedCheckpoint",
    "SkippedCheckpoint",
    "step_dirname",
]

CHECKPOINTS_DIRNAME = "checkpoints"
COMMITTED_FILENAME = "COMMITTED"
LATEST_FILENAME = "LATEST"
MANIFEST_FORMAT = "rollout-recovery-checkpoint"
MANIFEST_VERSION = 2
#: Beside the checkpoints directory: shared by readers (the auditor) and held exclusively
#: while a save or a prune changes what is published, so a reader never sees a checkpoint
#: vanish or LATEST move mid-read.
READ_LOCK_FILENAME = ".checkpoints.lock"

_STEP_RE = re.compile(r"step_([0-9]{6,})")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_TEMP_PREFIX = ".tmp-"
_REPLACED_PREFIX = ".replaced-"
_TRASH_PREFIX = ".trash-"
# atomic_write_bytes's own temporary for LATEST, left behind only by a SIGKILL.
_LATEST_TEMP_RE = re.compile(r"\.LATEST\..*\.tmp")

T = TypeVar("T")


def step_dirname(step: int) -> str:
    """``step_000010``: six digits so names sort like steps in a listing (more if needed)."""
    return f"step_{step:06d}"


def _parse_step_dirname(name: str) -> int | None:
    """The step of a canonical ``step_NNNNNN`` name; None for anything else."""
    match = _STEP_RE.fullmatch(name)
    if match is None:
        return None
    step = int(match.group(1))
    # "step_0000010" would alias step 10: only the one canonical spelling is a checkpoint.
    return step if step_dirname(step) == name else None


def _check_file_name(name: object) -> str | None:
    """Why ``name`` cannot be a checkpoint file name, or None if it can."""
    if not isinstance(name, str):
        return f"file names must be str, got {type(name).__name__}"
    if not name or name in {".", ".."}:
        return f"file name {name!r} is not a plain file name"
    if "/" in name or "\\" in name or "\0" in name:
        return f"file name {name!r} must be a plain name (no '/', '\\\\' or NUL)"
    if name == COMMITTED_FILENAME:
        return f"file name {name!r} is reserved for the commit marker"
    return None


@dataclass(frozen=True, slots=True)
class CommittedCheckpoint:
    """A ``step_NNNNNN`` directory holding a ``COMMITTED`` marker (not yet verified)."""

    step: int
    name: str
    directory: Path


@dataclass(frozen=True, slots=True)
class LoadedCheckpoint:
    """A checkpoint whose every manifest file was read and matched its size and sha256.

    ``marks`` are the lengths of the run's append-only files inside the checkpoint's cut
    (``{"events.jsonl": 81234, ...}``): the prefix of each file the checkpoint includes.
    """

    step: int
    name: str
    directory: Path
    files: dict[str, bytes]
    marks: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SkippedCheckpoint:
    """A checkpoint :meth:`CheckpointStore.newest_loadable` passed over, and why.

    ``reason`` is short and self-contained, e.g. ``rollout_recovery.pt: sha256 mismatch
    (...)`` or ``rejected by verify: InvalidStateError: ...``; ``error`` is the exception
    behind it, when there was one. ``step`` is None when ``LATEST`` named a non-checkpoint.
    """

    name: str
    directory: Path
    step: int | None
    reason: str
    error: BaseException | None = None

    def __str__(self) -> str:
        return f"{self.name}: {self.reason}"


class CheckpointStore:
    """The committed checkpoints of one run directory, ``root / "checkpoints"``.

    ``keep`` (>= 1) is how many committed checkpoints a save leaves behind, newest by step.
    Constructing a store touches nothing on disk.
    """

    #: The names of a checkpoint's files (``FILES.replay_index``, ...).
    FILES: ClassVar[CheckpointFiles] = CHECKPOINT_FILES

    def __init__(self, root: Path, *, keep: int) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise InvalidArgumentError(f"keep must be an int >= 1, got {keep!r}")
        self.root = Path(root)
        self.directory = self.root / CHECKPOINTS_DIRNAME
        self.keep = keep
        # Reentrant: save() runs remove_stale() under the same lock.
        self._lock = threading.RLock()
        self._ahead: _ReadAhead | None = None
        # The checkpoints put_back_replaced put back and their names aside, until
        # remove_stale accepts them or undo_put_back puts them aside again.
        self._put_back: list[tuple[Path, Path]] = []

    def __repr__(self) -> str:
        return f"CheckpointStore({str(self.root)!r}, keep={self.keep})"

    # -- writing --------------------------------------------------------------------------

    def save(
        self,
        step: int,
        files: Mapping[str, bytes | FileParts],
        *,
        marks: Mapping[str, int] | None = None,
    ) -> Path:
        """Write ``files`` as committed checkpoint ``step``; return its directory.

        The new checkpoint becomes the newest: committed checkpoints with a *higher* step
        belong to an abandoned timeline (the run resumed from an earlier checkpoint, so
        their state no longer matches the data plane) and are removed, then all but the
        newest ``keep`` are. An existing ``step_NNNNNN`` of the same step is replaced.

        ``marks`` (file name -> length) go into the manifest (see :class:`LoadedCheckpoint`).

        A file may be given as its parts (``FileParts``: a sidecar, one buffer per group):
        they are written one after another, never joined, and hashed for the manifest as
        they are written, so the whole save is one pass over each file's bytes here.

        Raises ``ValueError`` / ``TypeError`` for a bad step, file name or content, before
        touching the disk. An ``OSError`` (e.g. ENOSPC) before the commit rename leaves the
        previous checkpoints and ``LATEST`` as they were and removes the temporary
        directory; it propagates with that directory as its ``filename`` when the error
        itself named no file. An ``OSError`` after the rename (updating ``LATEST``,
        pruning) also propagates, but the new checkpoint is committed and will be found.
        """
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise InvalidArgumentError(f"checkpoint step must be an int >= 0, got {step!r}")
        contents: dict[str, memoryview | FileParts] = {}
        for file_name, data in files.items():
            problem = _check_file_name(file_name)
            if problem is not None:
                raise InvalidArgumentError(
                    f"cannot save checkpoint {step_dirname(step)}: {problem}"
                )
            if isinstance(data, FileParts):
                contents[file_name] = data
                continue
            if not isinstance(data, bytes | bytearray | memoryview):
                raise InvalidArgumentTypeError(
                    f"cannot save checkpoint {step_dirname(step)}: file {file_name!r} must "
                    f"be bytes or FileParts, got {type(data).__name__}"
                )
            # A byte view, so size and hash count bytes whatever the buffer's item type.
            contents[file_name] = memoryview(data).cast("B")
        checked_marks = _checked_marks(marks or {}, step)
        with self._lock:
            self._ensure_directory()
            with self._publication_lock(exclusive=True):
                return self._save_locked(step, contents, checked_marks)

    def _save_locked(
        self, step: int, contents: Mapping[str, memoryview | FileParts], marks: Mapping[str, int]
    ) -> Path:
        self._remove_stale_locked()
        name = step_dirname(step)
        final = self.directory / name
        temporary = self.directory / f"{_TEMP_PREFIX}{name}-{uuid.uuid4().hex}"
        try:
            self._write_and_commit(temporary, final, step, contents, marks)
        except OSError as exc:
            shutil.rmtree(temporary, ignore_errors=True)
            if exc.filename is None:
                # write()/fsync() errors carry no path; name the directory being built.
                raise OSError(exc.errno, exc.strerror or str(exc), str(temporary)) from exc
            raise
        except BaseException:
            shutil.rmtree(temporary, ignore_errors=True)
            raise
        crash_point("checkpoint.before_latest")
        atomic_write_bytes(self.directory / LATEST_FILENAME, f"{name}\n".encode("ascii"))
        self._prune(step)
        return final

    def _ensure_directory(self) -> None:
        if self.directory.is_dir():
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        # The new directory's entry lives in root; without this fsync a power cut could
        # lose the whole checkpoints/ directory along with everything committed into it.
        fsync_directory(self.root)

    @contextlib.contextmanager
    def _publication_lock(self, *, exclusive: bool) -> Iterator[None]:
        """``flock`` on ``checkpoints/.lock``: exclusive to publish or prune, shared to read.

        A reader in a directory no save has locked yet (no lock file) needs no lock: there
        is nothing being published.
        """
        path = self.root / READ_LOCK_FILENAME
        try:
            flags = os.O_RDWR | os.O_CREAT if exclusive else os.O_RDONLY
            fd = os.open(path, flags | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Hold the shared read lock: checkpoints and LATEST do not change in the block.

        For a reader of a live run (the auditor): a save or a prune in progress finishes
        first, the next one waits for the block to end.
        """
        if not self.directory.is_dir():
            yield
            return
        with self._publication_lock(exclusive=False):
            yield

    def _write_and_commit(
        self,
        temporary: Path,
        final: Path,
        step: int,
        files: Mapping[str, memoryview | FileParts],
        marks: Mapping[str, int],
    ) -> None:
        temporary.mkdir()
        entries: dict[str, dict[str, Any]] = {}
        for file_name, data in files.items():
            digest = hashlib.sha256()
            size = write_new_file(temporary / file_name, data, observe=digest.update)
            entries[file_name] = {"size": size, "sha256": digest.hexdigest()}
        # The files' directory entries must be durable before a marker that vouches for them.
        fsync_directory(temporary)
        manifest = {
            "format": MANIFEST_FORMAT,
            "version": MANIFEST_VERSION,
            "step": step,
            "files": entries,
            "marks": dict(marks),
        }
        crash_point("checkpoint.before_committed")
        write_new_file(
            temporary / COMMITTED_FILENAME,
            (json.dumps(manifest, sort_keys=True, indent=1) + "\n").encode("utf-8"),
        )
        fsync_directory(temporary)
        crash_point("checkpoint.before_rename")
        replaced: Path | None = None
        if final.exists():
            # rename() cannot replace a non-empty directory, so the old one steps aside
            # first. If we die between the two renames, remove_stale renames it back.
            replaced = self.directory / f"{_REPLACED_PREFIX}{final.name}-{uuid.uuid4().hex}"
            os.rename(final, replaced)
        try:
            os.rename(temporary, final)
        except BaseException:
            if replaced is not None:
                os.rename(replaced, final)
            raise
        fsync_directory(self.directory)
        if replaced is not None:
            shutil.rmtree(replaced, ignore_errors=True)

    def _prune(self, saved_step: int) -> None:
        """Remove every step directory but the newest ``keep`` committed ones <= saved_step.

        That also removes step directories without ``COMMITTED`` (our saves never make
        one, so they are damage, and would be reported at every resume) and any step above
        the one just saved (an abandoned timeline, see :meth:`save`).
        """
        kept = 0
        victims = []
        for step, name, path in self._step_directories():
            if step <= saved_step and (path / COMMITTED_FILENAME).is_file() and kept < self.keep:
                kept += 1
            else:
                victims.append((name, path))
        if not victims:
            return
        trashed = []
        for name, path in victims:
            # One atomic rename makes it a non-candidate at once; deleting file by file
            # could leave a half-deleted checkpoint that still carries COMMITTED.
            trash = self.directory / f"{_TRASH_PREFIX}{name}-{uuid.uuid4().hex}"
            os.rename(path, trash)
            trashed.append(trash)
        fsync_directory(self.directory)
        for trash in trashed:
            shutil.rmtree(trash, ignore_errors=True)

    def remove_stale(self) -> list[Path]:
        """Clean up after a killed save; return the paths removed.

        Removes temporary and trash directories and ``LATEST`` temporaries. A
        ``.replaced-step_N`` directory is renamed back to ``step_N`` if a save died between
        its two renames (so no committed checkpoint is lost), and removed otherwise.
        Best effort: what cannot be removed now is retried next time.
        """
        with self._lock:
            if not self.directory.is_dir():
                return []
            with self._publication_lock(exclusive=True):
                return self._remove_stale_locked()

    def put_back_replaced(self) -> list[Path]:
        """Only the first part of :meth:`remove_stale`: rename each ``.replaced-step_N``
        whose ``step_N`` is missing back (a committed checkpoint a killed re-save swapped
        out); the checkpoints put back. A resuming job runs it before it chooses the newest
        checkpoint, and leaves the rest of the leftovers until its run is accepted
        (:meth:`remove_stale`); a run refused before that calls :meth:`undo_put_back`.
        Nothing is written (not even the lock file) when there is nothing to put back."""
        with self._lock:
            if not self.directory.is_dir():
                return []
            # One writer per run directory (the caller holds its lock): nothing can add a
            # ``.replaced-`` directory between this look and the locked rename below.
            if not any(map(self._replaced_original, self.directory.iterdir())):
                return []
            with self._publication_lock(exclusive=True):
                put_back = self._put_back_replaced_locked()
                if put_back:
                    fsync_directory(self.directory)
                return put_back

    def undo_put_back(self) -> list[Path]:
        """Rename the checkpoints :meth:`put_back_replaced` put back to their names aside
        again, unless :meth:`remove_stale` (a run accepted) came since: a refused run
        leaves the directory as it found it. The aside paths restored.

        Crash safe at every point: each rename moves one committed checkpoint between its
        two names, both of which :meth:`put_back_replaced` and the restore recognize.
        """
        with self._lock:
            pending, self._put_back = self._put_back, []
            if not pending:
                return []
            restored = []
            with self._publication_lock(exclusive=True):
                for original, aside in reversed(pending):
                    if aside.exists() or not original.is_dir():
                        continue
                    with contextlib.suppress(OSError):
                        os.rename(original, aside)
                        restored.append(aside)
                if restored:
                    fsync_directory(self.directory)
            return restored

    def _put_back_replaced_locked(self) -> list[Path]:
        put_back = []
        for entry in sorted(self.directory.iterdir()):
            original = self._replaced_original(entry)
            if original is not None:
                with contextlib.suppress(OSError):
                    os.rename(entry, original)
                    put_back.append(original)
                    self._put_back.append((original, entry))
        return put_back

    def _replaced_original(self, entry: Path) -> Path | None:
        """The missing ``step_N`` a ``.replaced-step_N-<hex>`` directory is, or None."""
        if not entry.name.startswith(_REPLACED_PREFIX):
            return None
        original = self.directory / entry.name[len(_REPLACED_PREFIX) :].rsplit("-", 1)[0]
        if _parse_step_dirname(original.name) is None or original.exists():
            return None
        return original

    def _remove_stale_locked(self) -> list[Path]:
        if not self.directory.is_dir():
            return []
        removed: list[Path] = []
        changed = bool(self._put_back_replaced_locked())
        # Accepted: what was put back stays (undo_put_back has nothing left to undo).
        self._put_back = []
        for entry in sorted(self.directory.iterdir()):
            entry_name = entry.name
            if self._replaced_original(entry) is not None:
                continue  # a checkpoint that could not be put back: kept, tried next time
            if entry_name.startswith((_TEMP_PREFIX, _TRASH_PREFIX, _REPLACED_PREFIX)):
                shutil.rmtree(entry, ignore_errors=True)
            elif _LATEST_TEMP_RE.fullmatch(entry_name):
                entry.unlink(missing_ok=True)
            else:
                continue
            if not entry.exists():
                removed.append(entry)
                changed = True
        if changed:
            fsync_directory(self.directory)
        return removed

    # -- reading --------------------------------------------------------------------------

    def _step_directories(self) -> list[tuple[int, str, Path]]:
        """Every canonical ``step_NNNNNN`` directory, newest first, committed or not."""
        if not self.directory.is_dir():
            return []
        found = []
        for entry in self.directory.iterdir():
            step = _parse_step_dirname(entry.name)
            if step is not None and entry.is_dir():
                found.append((step, entry.name, entry))
        found.sort(reverse=True)
        return found

    def committed(self) -> list[CommittedCheckpoint]:
        """Every ``step_NNNNNN`` directory holding ``COMMITTED``, newest step first.

        Cheap: the marker's presence is checked, not its content nor the files' hashes.
        """
        return [
            CommittedCheckpoint(step, name, path)
            for step, name, path in self._step_directories()
            if (path / COMMITTED_FILENAME).is_file()
        ]

    def latest_hint(self) -> str | None:
        """The name ``LATEST`` holds (stripped), or None if there is no ``LATEST``."""
        try:
            raw = (self.directory / LATEST_FILENAME).read_bytes()
        except FileNotFoundError:
            return None
        return raw.decode("utf-8", errors="replace").strip()

    def load(
        self, checkpoint: CommittedCheckpoint, *, skip: Callable[[str], bool] | None = None
    ) -> LoadedCheckpoint:
        """Read and verify every file of ``checkpoint`` against its ``COMMITTED`` manifest
        (but those ``skip`` names: a reader that needs no model weights reads none).

        Raises :class:`~rollout_recovery.errors.CheckpointDirectoryError` (directory =
        the checkpoint's) naming exactly what is wrong: a missing or unreadable marker, bad
        manifest JSON or field, a missing or unreadable file, or a size or sha256 mismatch.
        """
        directory = checkpoint.directory
        fail = _failure_in(directory)
        manifest, entries = _read_manifest(checkpoint, fail)
        files: dict[str, bytes] = {}
        for file_name, (size, sha256) in entries.items():
            if skip is not None and skip(file_name):
                continue
            data = _read_or_fail(
                directory / file_name,
                fail,
                missing=f"{file_name}: missing (listed in {COMMITTED_FILENAME})",
                unreadable=f"{file_name}: cannot read",
            )
            if len(data) != size:
                raise fail(f"{file_name}: size mismatch (manifest {size} bytes, file {len(data)})")
            actual = hashlib.sha256(data).hexdigest()
            if actual != sha256:
                raise fail(f"{file_name}: sha256 mismatch (manifest {sha256}, file {actual})")
            files[file_name] = data
        return LoadedCheckpoint(
            checkpoint.step, checkpoint.name, directory, files, _manifest_marks(manifest, fail)
        )

    def read_marks(self, checkpoint: CommittedCheckpoint) -> dict[str, int]:
        """The ``marks`` of ``checkpoint``'s ``COMMITTED`` manifest, read without its files.

        For a reader that needs only where the checkpoint's history ends (the journal
        inspector): the manifest is validated as :meth:`load` does, the files (a model's
        weights, perhaps) are neither read nor hashed. Raises
        :class:`~rollout_recovery.errors.CheckpointDirectoryError` as :meth:`load` does.
        """
        fail = _failure_in(checkpoint.directory)
        manifest, _ = _read_manifest(checkpoint, fail)
        return _manifest_marks(manifest, fail)

    def read_ahead(self) -> None:
        """Start :meth:`load` of the newest committed checkpoint in a thread of its own,
        for :meth:`newest_loadable` to take instead of reading it again.

        A resuming job calls it as soon as it holds the run's lock: the files are read and
        checked against the manifest (a model's weights and moments: seconds of reading and
        SHA-256, both outside the GIL) while the job imports its libraries and builds its
        model, instead of after. The check is the same one, so a damaged checkpoint is still
        passed over; its result (the loaded checkpoint or the error) is used once, and only
        for the directory it read. Until :meth:`newest_loadable` takes it (or
        :meth:`drop_read_ahead`), the files are held in memory. Nothing if none is committed.
        """
        if self._ahead is not None:
            return
        committed = self.committed()
        if committed:
            self._ahead = _ReadAhead(self, committed[0])

    def drop_read_ahead(self) -> None:
        """Wait for a read-ahead still running and forget it (a job that stops before its
        restore: no thread of it reads on after the job let go of the directory)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.wait()

    def _load_candidate(self, checkpoint: CommittedCheckpoint) -> LoadedCheckpoint:
        """:meth:`load` of ``checkpoint``: the read-ahead's result when it read that very
        directory (taken once), else read now."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead.read(checkpoint):
            return ahead.result()
        if ahead is not None:
            ahead.wait()  # another directory (replaced or newer since): not used
        return self.load(checkpoint)

    def newest_loadable(
        self, verify: Callable[[LoadedCheckpoint], T]
    ) -> tuple[LoadedCheckpoint, T, list[SkippedCheckpoint]] | None:
        """The newest checkpoint that loads and that ``verify`` accepts, with what was skipped.

        Walks the ``step_NNNNNN`` directories newest first (a directory without
        ``COMMITTED`` is skipped as incomplete), loads each and calls ``verify`` on it;
        ``verify`` rejects by raising a ``RolloutRecoveryError``, ``ValueError`` or
        ``OSError`` (anything else is a bug and propagates). Returns the first accepted
        one, ``verify``'s result, and the skipped ones in the order met. ``LATEST`` is
        only a hint: if it names something that is not a committed checkpoint, that is
        reported first among the skipped.

        Returns None only when the directory shows no trace of a checkpoint (no
        ``step_*`` directory, no ``LATEST``): a fresh run. If checkpoints exist but none is
        usable it raises ``CheckpointDirectoryError`` listing every reason, because
        silently starting over would throw the run's progress away.
        """
        candidates = self._step_directories()
        latest = self.latest_hint()
        if not candidates and latest is None:
            return None
        skipped: list[SkippedCheckpoint] = []
        # A LATEST naming an existing step directory needs no entry of its own: if that
        # directory is not committed, the walk below reports it anyway.
        if latest is not None and latest not in {name for _, name, _ in candidates}:
            reason = f"{LATEST_FILENAME} names {latest!r}, which is not a checkpoint directory"
            latest_step = _parse_step_dirname(latest)
            skipped.append(SkippedCheckpoint(latest, self.directory / latest, latest_step, reason))
        for step, name, path in candidates:
            checkpoint = CommittedCheckpoint(step, name, path)
            try:
                loaded = self._load_candidate(checkpoint)
            except CheckpointDirectoryError as exc:
                skipped.append(SkippedCheckpoint(name, path, step, _strip_directory(exc), exc))
                continue
            try:
                result = verify(loaded)
            except (RolloutRecoveryError, ValueError, OSError) as exc:
                reason = f"rejected by verify: {type(exc).__name__}: {exc}"
                skipped.append(SkippedCheckpoint(name, path, step, reason, exc))
                continue
            return loaded, result, skipped
        raise CheckpointDirectoryError(
            "no loadable checkpoint: " + "; ".join(str(s) for s in skipped),
            directory=str(self.directory),
        )


class _ReadAhead:
    """One :meth:`CheckpointStore.load` running in a daemon thread; :meth:`result` is its
    loaded checkpoint, or raises what the load raised."""

    def __init__(self, store: CheckpointStore, checkpoint: CommittedCheckpoint) -> None:
        self.checkpoint = checkpoint
        # The directory read: a re-save of the same step swaps in another (a new inode).
        self._identity = _directory_identity(checkpoint.directory)
        self._store = store
        self._loaded: LoadedCheckpoint | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"read-ahead-{checkpoint.name}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        try:
            self._loaded = self._store.load(self.checkpoint)
        except BaseException as error:  # re-raised in the caller's thread by result()
            self._error = error

    def read(self, checkpoint: CommittedCheckpoint) -> bool:
        """Whether this read ``checkpoint``'s directory as it is now."""
        self.wait()
        return checkpoint == self.checkpoint and self._identity == _directory_identity(
            checkpoint.directory
        )

    def wait(self) -> None:
        self._thread.join()

    def result(self) -> LoadedCheckpoint:
        self.wait()
        if self._error is not None:
            raise self._error
        assert self._loaded is not None
        return self._loaded


def _directory_identity(directory: Path) -> tuple[int, int, int] | None:
    try:
        found = directory.stat()
    except OSError:
        return None
    return found.st_dev, found.st_ino, found.st_ctime_ns


def _failure_in(directory: Path) -> Callable[[str], CheckpointDirectoryError]:
    """The error of a damaged checkpoint, naming its directory."""

    def fail(message: str) -> CheckpointDirectoryError:
        return CheckpointDirectoryError(message, directory=str(directory))

    return fail


def _read_manifest(
    checkpoint: CommittedCheckpoint, fail: Callable[[str], CheckpointDirectoryError]
) -> tuple[dict[str, Any], dict[str, tuple[int, str]]]:
    """``checkpoint``'s ``COMMITTED`` manifest, parsed and checked, and its file entries."""
    raw = _read_or_fail(
        checkpoint.directory / COMMITTED_FILENAME,
        fail,
        missing=f"missing {COMMITTED_FILENAME} marker (incomplete checkpoint)",
        unreadable=f"cannot read {COMMITTED_FILENAME}",
    )
    try:
        manifest = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise fail(f"{COMMITTED_FILENAME} is not valid JSON: {exc}") from None
    entries = _check_manifest(manifest, checkpoint.step, fail)
    return manifest, entries


def _read_or_fail(
    path: Path,
    fail: Callable[[str], CheckpointDirectoryError],
    *,
    missing: str,
    unreadable: str,
) -> bytes:
    """``path``'s bytes; a missing or unreadable file is the checkpoint's fault."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise fail(missing) from None
    except OSError as exc:
        raise fail(f"{unreadable}: {exc}") from exc


def _check_manifest(
    manifest: object, step: int, fail: Callable[[str], CheckpointDirectoryError]
) -> dict[str, tuple[int, str]]:
    """Validate a parsed ``COMMITTED`` manifest; return ``{file: (size, sha256)}``."""
    where = COMMITTED_FILENAME
    if not isinstance(manifest, dict):
        raise fail(f"{where}: manifest must be a JSON object, got {type(manifest).__name__}")
    expected = {"format", "version", "step", "files", "marks"}
    if set(manifest) != expected:
        missing = sorted(expected - set(manifest))
        extra = sorted(set(manifest) - expected)
        raise fail(f"{where}: manifest fields wrong (missing {missing}, unexpected {extra})")
    if manifest["format"] != MANIFEST_FORMAT:
        raise fail(f"{where}: format is {manifest['format']!r}, expected {MANIFEST_FORMAT!r}")
    version = manifest["version"]
    if isinstance(version, bool) or version != MANIFEST_VERSION:
        raise fail(f"{where}: unsupported version {version!r} (supported: {MANIFEST_VERSION})")
    manifest_step = manifest["step"]
    if isinstance(manifest_step, bool) or manifest_step != step:
        raise fail(f"{where}: step is {manifest_step!r}, but the directory is {step_dirname(step)}")
    files = manifest["files"]
    if not isinstance(files, dict):
        raise fail(f"{where}: files must be an object, got {type(files).__name__}")
    entries: dict[str, tuple[int, str]] = {}
    for file_name, entry in files.items():
        problem = _check_file_name(file_name)
        if problem is not None:
            raise fail(f"{where}: {problem}")
        if not isinstance(entry, dict) or set(entry) != {"size", "sha256"}:
            raise fail(f"{where}: files[{file_name!r}] must be {{'size', 'sha256'}}, got {entry!r}")
        size, sha256 = entry["size"], entry["sha256"]
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise fail(f"{where}: files[{file_name!r}].size must be an int >= 0, got {size!r}")
        if not isinstance(sha256, str) or not _SHA256_RE.fullmatch(sha256):
            raise fail(
                f"{where}: files[{file_name!r}].sha256 must be 64 lowercase hex digits, "
                f"got {sha256!r}"
            )
        entries[file_name] = (size, sha256)
    return entries


def _checked_marks(marks: Mapping[str, int], step: int) -> dict[str, int]:
    """Validate ``save``'s marks before anything is written."""
    checked: dict[str, int] = {}
    for name, length in marks.items():
        problem = _check_file_name(name)
        if problem is not None:
            raise InvalidArgumentError(
                f"cannot save checkpoint {step_dirname(step)}: mark {problem}"
            )
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise InvalidArgumentError(
                f"cannot save checkpoint {step_dirname(step)}: mark {name!r} must be an "
                f"int >= 0, got {length!r}"
            )
        checked[name] = length
    return checked


def _manifest_marks(
    manifest: dict[str, Any], fail: Callable[[str], CheckpointDirectoryError]
) -> dict[str, int]:
    marks = manifest["marks"]
    if not isinstance(marks, dict):
        raise fail(f"{COMMITTED_FILENAME}: marks must be an object, got {type(marks).__name__}")
    for name, length in marks.items():
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise fail(f"{COMMITTED_FILENAME}: marks[{name!r}] must be an int >= 0, got {length!r}")
    return dict(marks)


def _strip_directory(exc: CheckpointDirectoryError) -> str:
    """The message of ``exc`` without its ``"<directory>: "`` prefix."""
    text = str(exc)
    prefix = f"{exc.directory}: "
    return text[len(prefix) :] if exc.directory and text.startswith(prefix) else text
