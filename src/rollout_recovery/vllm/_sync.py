"""Loading the trainer's weights into running vLLM servers over HTTP, without a restart.

One push of version N to one server (vLLM 0.32 with ``VLLM_SERVER_DEV_MODE=1`` and this
package's worker extension, see :func:`server_command`):

1. the weights are written once per version, for every server, as a safetensors file in
   the weights directory (the version in its metadata): straight from the weights, cast
   into a mapping of the file where the servers' dtype is another
   (``TorchWeights.write_safetensors``), under a temporary name renamed into
   place, so a server never reads half a file. Never fsynced: the file lives only as long
   as a push needs it (a job that restarts writes its weights again), and the job's
   launched servers get it in shared memory (:func:`shared_memory_dir`), so a push
   touches no disk. A new version takes the file of the version it supersedes once no
   push reads it (its pages reused, not allocated and zeroed again); a file of at most
   4 MB is written on the event loop, a larger one in a thread.
   :meth:`VllmWeightSync.prepare` writes it ahead of the push (the pool does, before it
   waits for the server's calls to end). In the servers' dtype the torch trainer's
   snapshot *is* the file (:meth:`VllmWeightSync.place`, ``TorchWeights.capture_into``:
   written once from the live parameters when the version is handed over, viewed
   read-only by the snapshot): then a file is rewritten for a later version only once
   no snapshot view of it is left either, and the newest superseded placed file is kept
   for that (the job's steady state: two files in turn);
2. ``POST /pause?mode=wait&clear_cache=true``: requests still running finish, new ones
   queue, and once the engine is idle its KV and prefix caches are dropped (trap: a
   cached prefix computed under the old weights would be reused under the new ones).
   vLLM's pause fails if the reset does, and a paused engine schedules nothing until
   ``/resume``, so no prefix is cached between the reset and the load;
3. ``POST /update_weight_version "loading"``: until the load is confirmed the server
   names no version (its reply must say so, or no load follows), so a push that fails
   half way never leaves old weights under a new name or new weights under an old one;
4. ``POST /collective_rpc rollout_recovery_load(path, N)``: the worker loads the file in
   place and re-packs a tied ``lm_head`` (trap: on CPU it would keep the old embedding);
5. ``POST /update_weight_version N``: its success is the engine's own (vLLM answers once
   the engine core holds the name), so no ``GET /weight_info`` follows (the pool's
   probes ask it between pushes);
6. ``POST /resume`` (always, even after a failure: a paused server would hold every
   later call).

Five requests, two fewer than before issue 28: the separate ``/reset_prefix_cache`` after
the load repeated what the pause had done, and ``/weight_info`` read back what step 5
had just been told.

With ``[generation] on_weight_update = "interrupt"`` (:meth:`VllmWeightSync.push_keeping_calls`)
step 2 is ``/pause?mode=keep`` (requests in flight freeze between tokens; vLLM then
clears no cache) and after step 5 ``POST /reset_prefix_cache?reset_running_requests=true``
(it must report success) preempts the frozen requests, which are recomputed under the new
weights on resume; the pool then does not drain the server first.

The third trap, a load while a request runs (its later tokens would come from the new
weights under the old stamp), is why this sync is *exclusive*: the pool sends a server no
call at a version other than the one it holds while its push is pending, starts the
push once its calls have ended (and step 2 waits for any request the server still runs,
e.g. one whose client gave up).

Every reply is read under a small cap and decoded with msgspec; one of another shape is a
failed push (``None``), never an exception. The dev routes (``/pause``,
``/collective_rpc``, ...) are not covered by vLLM's API key: launched servers listen on a
socket only this user can reach (``_fleet.py``); run listed ones on a trusted network.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import hashlib
import json
import math
import os
import re
import shutil
import struct
import time
import weakref
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, Literal, Protocol, TypeVar

import httpx
import msgspec

from .._clock import monotonic
from .._crashpoints import crash_point
from .._durable import atomic_write_bytes
from .._http import parse_version, read_capped
from .._lifecycle import Resource
from .._unix_http import require_private_dir
from ..errors import InvalidArgumentError, InvalidArgumentTypeError, InvalidStateError

__all__ = [
    "LOADING_TAG",
    "LOAD_METHOD",
    "SHARED_MEMORY",
    "SafetensorsWeights",
    "VllmWeightSync",
    "run_key",
    "shared_memory_dir",
    "shared_memory_weights",
    "weights_bytes",
    "weights_file_name",
]

#: The worker extension's method (``_extension/rollout_recovery_vllm_extension.py``).
LOAD_METHOD = "rollout_recovery_load"
#: What a server is named while it loads: no version (``parse_version`` gives None).
LOADING_TAG = "loading"
#: Where the weight files of launched servers go: memory, not disk (Linux's tmpfs).
SHARED_MEMORY = Path("/dev/shm")
_T = TypeVar("_T")
# What a control route's reply may weigh.
_REPLY_CAP = 64 * 2**10
# How long the resume after a failed push may take: the push's own deadline may be spent.
_RESUME_TIMEOUT_S = 10.0
# Bytes per element of the dtypes a server runs in.
_ITEM_SIZES = {"bfloat16": 2, "float16": 2, "float32": 4}
# A weights file up to this size is written on the event loop, not in a thread.
_WRITE_ON_LOOP_BYTES = 4 * 2**20
# What a safetensors header read to size a model may weigh.
_HEADER_CAP = 100 * 2**20
# In a run's shared-memory directory: the run's lock file and the job's pid.
_OWNER = "owner"
_FILE = re.compile(r"^weights-v(\d+)\.safetensors$")
# A file being written: the final name behind a dot, the writer's pid after it.
_PARTIAL = re.compile(r"^\.weights-v\d+\.safetensors\.(\d+)\.tmp$")


def _file_bytes(weights: object, dtype: str) -> int | None:
    """About what the weights file of ``weights`` weighs (their ``num_parameters``, as
    ``TorchWeights`` has); None where they do not say."""
    count = getattr(weights, "num_parameters", None)
    if isinstance(count, bool) or not isinstance(count, int):
        return None
    return count * _ITEM_SIZES.get(dtype, 4)


def weights_file_name(version: int) -> str:
    return f"weights-v{version:010d}.safetensors"


def shared_memory_dir(key: str, root: Path = SHARED_MEMORY) -> Path | None:
    """The directory for the weight files of one run (``key``) in shared memory:
    ``root/rollout-recovery-<uid>/<key>``, both private to this user (0700), created if
    missing; None where the machine has no ``root`` (not Linux). ``InvalidStateError``
    if the user's directory there is not private (a symlink, another user's, or others
    may enter it): a file in it could be read, or replaced, by someone else.

    The files are the servers' to read: they must run on this machine (launched servers
    do). Nothing here survives a reboot, and a job killed with SIGKILL leaves its files
    until the same run starts again (its sync removes other versions' files) or another
    job starts (:func:`_sweep_abandoned`); see ``docs/reliability.md``."""
    if not root.is_dir():
        return None
    user = root / f"rollout-recovery-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        user.mkdir(mode=0o700)
    require_private_dir(user, "weight files would be written there (remove it)")
    directory = user / key
    with contextlib.suppress(FileExistsError):
        directory.mkdir(mode=0o700)
    return directory


def run_key(run_directory: Path) -> str:
    """The name of a run's directory in shared memory: its run directory's resolved
    path, hashed (a rerun of the run finds the killed job's files)."""
    digest = hashlib.sha256(os.fsencode(Path(run_directory).resolve())).hexdigest()
    return f"run-{digest[:20]}"


def weights_bytes(model: Path, dtype: str) -> int:
    """About what one weights file of ``model`` (a directory of safetensors files, what
    vLLM loads) weighs in ``dtype``: its tensors counted from the files' headers; 0 where
    it cannot tell."""
    size = _ITEM_SIZES.get(dtype)
    total = 0
    try:
        for file in sorted(Path(model).glob("*.safetensors")):
            with file.open("rb") as handle:
                (length,) = struct.unpack("<Q", handle.read(8))
                header = json.loads(handle.read(min(length, _HEADER_CAP)))
            for name, entry in header.items():
                if name != "__metadata__":
                    first, last = entry["data_offsets"]
                    total += math.prod(entry["shape"]) * size if size else last - first
    except (OSError, ValueError, KeyError, TypeError, AttributeError, struct.error):
        return 0
    return int(total)


@contextlib.contextmanager
def shared_memory_weights(
    run_directory: Path,
    root: Path = SHARED_MEMORY,
    *,
    needs: int = 0,
    log: Callable[[str], None] = lambda _: None,
    lock_file: Path | None = None,
) -> Iterator[Path | None]:
    """The run's weights directory in shared memory (:func:`shared_memory_dir` named
    :func:`run_key`), removed with all it holds on exit; None where there is no shared
    memory, and None with a notice to ``log`` where ``root`` has less than ``needs``
    bytes free (a full tmpfs fails every push) or the user's directory there is not
    private (another user may create it in a sticky ``/dev/shm`` first): the caller then
    writes the files to disk.

    With the run's ``lock_file`` (the job holds it), the directory names it and this
    process in an ``owner`` file, and the directories of other runs that no job holds
    are removed first (:func:`_sweep_abandoned`)."""
    directory = None
    if root.is_dir():
        stats = os.statvfs(root)
        free = stats.f_bavail * stats.f_frsize
        if free < needs:
            log(
                f"vLLM weight files go to the run directory: {root} has {free / 2**20:.0f} MB "
                f"free, a version's files need {needs / 2**20:.0f} MB"
            )
        else:
            try:
                directory = shared_memory_dir(run_key(run_directory), root)
            except (InvalidStateError, OSError) as error:
                log(f"vLLM weight files go to the run directory: {error}")
    if directory is not None and lock_file is not None:
        owner = f"{Path(lock_file).resolve()}\n{os.getpid()}\n"
        atomic_write_bytes(directory / _OWNER, owner.encode())
        _sweep_abandoned(directory.parent, own=directory.name)
    try:
        yield directory
    finally:
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)


def _sweep_abandoned(user: Path, *, own: str) -> None:
    """Remove the shared-memory directories of runs no job holds: a job killed with
    SIGKILL that no rerun followed (or whose run directory moved: the rerun's is named
    by another hash) would otherwise keep its weights in RAM until a reboot.

    One is removed only if its ``owner`` names a run lock that is free (or gone) and a
    process that is gone; a directory without an owner file (being created, or from an
    older version) or of this run (an adopted server may be loading from it) is left.
    The lock is held (shared) while the directory goes, so a rerun starting in that
    moment is refused, never robbed of its files."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(user):
            if not entry.name.startswith("run-") or entry.name == own:
                continue
            try:
                lock, pid = Path(entry.path, _OWNER).read_text(encoding="utf-8").split("\n")[:2]
                alive = _process_alive(int(pid))
            except (OSError, UnicodeDecodeError, ValueError):
                continue
            if alive:
                continue
            with _held_if_free(Path(lock)) as free:
                if free:
                    shutil.rmtree(entry.path, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def _held_if_free(lock_file: Path) -> Iterator[bool]:
    """Whether no job holds the run lock ``lock_file`` (a missing file: none), holding
    it (shared) for the block when so: a non-blocking probe, never a wait."""
    try:
        fd = os.open(lock_file, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        yield True
        return
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # releases the lock


class _RpcReply(msgspec.Struct):
    results: list[dict[str, Any] | None]


class _TagReply(msgspec.Struct):
    success: bool
    new_version: str | None = None


class _ResetReply(msgspec.Struct):
    success: bool


def _decode(raw: bytes, shape: type[Any]) -> Any:
    try:
        return msgspec.json.decode(raw, type=shape)
    except (msgspec.DecodeError, RecursionError):
        return None


class SafetensorsWeights(Protocol):
    """What this sync pushes: a versioned snapshot that writes itself as a safetensors
    file (``llm.TorchWeights``)."""

    @property
    def version(self) -> int: ...

    def write_safetensors(self, file: BinaryIO, dtype: str) -> None:
        """Write the whole file into ``file`` (open for reading and writing, at offset
        0). It may hold a superseded version's bytes: size it to this file's length and
        write every byte."""
        ...


def _size_or_none(path: Path) -> int | None:
    """``path``'s size, or None once it is gone (one ``stat``, no race with a removal)."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return None


class VllmWeightSync(Resource):
    """A ``WeightSync[SafetensorsWeights]`` (``TorchWeights``) for vLLM servers; see the
    module docstring.

    ``directory`` holds the weight files (created if missing, files 0600). The newest
    ``keep`` versions written are kept, any version a push is still loading, and the
    newest superseded one placed (:meth:`place`, for a later version to take its pages);
    older files are removed, and :meth:`close` removes them all. ``dtype`` is the name the files are
    written in (the servers' dtype: half the bytes of fp32 for a bf16 server, and the
    same rounding as vLLM's own cast).
    """

    name: Literal["vllm"] = "vllm"
    tracks_versions = True
    exclusive = True

    def __init__(self, directory: Path, *, dtype: str = "bfloat16", keep: int = 1) -> None:
        if keep < 1:
            raise InvalidArgumentError(f"keep must be >= 1, got {keep}", path="$.keep")
        self._directory = Path(directory)
        self._dtype = dtype
        self._keep = keep
        # Each version's file: being written (a future) or written whole (its path).
        self._files: dict[int, asyncio.Future[Path] | Path] = {}
        self._reading: Counter[int] = Counter()  # versions pushes are loading now
        # The files this process reads too (``place``): what holds their pages, weakly.
        self._views: dict[int, weakref.ref[object]] = {}
        self._swept = False
        self._closed = False  # the job's end: nothing is placed after it (nothing would remove it)
        self._file_seconds: dict[int, float] = {}  # each file's write, in its thread
        self._phases: dict[str, dict[str, float]] = {}  # the newest push's, by url

    @property
    def directory(self) -> Path:
        return self._directory

    @property
    def dtype(self) -> str:
        """The dtype the files are written in, by name."""
        return self._dtype

    # -- the weight files -------------------------------------------------------------------

    @staticmethod
    def check(version: int, weights: object) -> None:
        """Refuse weights this sync cannot write, or of another version than announced.

        Takes any object: the job calls it where the config, not the types, chose this
        sync for a trainer (the registry's HTTP builder, ``control/_backends.py``)."""
        found = getattr(weights, "version", None)
        if not callable(getattr(weights, "write_safetensors", None)) or not isinstance(found, int):
            raise InvalidArgumentTypeError(
                "the vllm weight sync pushes weights with a version and write_safetensors() "
                f"(TorchWeights), got {type(weights).__name__}"
            )
        if found != version:
            raise InvalidArgumentError(f"weights are version {found}, pushed as {version}")

    def _write(
        self, version: int, write: Callable[[BinaryIO], _T], recycled: Path | None
    ) -> tuple[Path, _T]:
        self._directory.mkdir(parents=True, exist_ok=True)
        path = self._directory / weights_file_name(version)
        partial = self._directory / f".{path.name}.{os.getpid()}.tmp"
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        if recycled is not None:
            # Its pages are reused (the writer overwrites every byte, see
            # ``SafetensorsWeights``): no fresh pages to allocate and zero. Renamed away
            # first, so no server finds it half rewritten under a version's name.
            try:
                os.replace(recycled, partial)
            except FileNotFoundError:
                recycled = None
        if recycled is None:
            flags |= os.O_TRUNC
        # The write's own seconds, in its thread (a report, never a deadline): against
        # the pool's ``write_s``, which the loop measures, it shows a loop slow to notice.
        began = time.perf_counter()
        try:
            with os.fdopen(os.open(partial, flags, 0o600), "w+b") as handle:
                written = write(handle)
            os.replace(partial, path)  # a server opens the whole file or none
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        self._file_seconds[version] = time.perf_counter() - began
        return path, written

    def place(self, version: int, write: Callable[[BinaryIO], object]) -> None:
        """The file of ``version`` made now by ``write`` (the trainer's snapshot written
        as its file, ``llm.TorchWeights.capture_into``: ``llm.SnapshotFiles``), on the
        caller's thread; a push of ``version`` finds it written. ``write`` returns what
        holds the file's pages for this process's readers (the snapshot's views): while
        it is alive the file is never rewritten for a later version. The newest
        superseded placed file is kept, so that the version after next can take its
        pages once its views are gone (the job's steady state: two files in turn, as
        the pool holds version N's snapshot while N+1 is placed). An OSError (no room,
        or a closed sync) leaves no file of ``version``: the trainer keeps a copy, and a
        push writes the file from it."""
        if self._closed:
            raise OSError(errno.ESHUTDOWN, f"{self._directory}: the weight sync is closed")
        # A file this version had before (a timeline a restore rolled back) is never
        # what a push of it finds, even when this write fails.
        self._files.pop(version, None)
        self._views.pop(version, None)
        recycled = self._recyclable(version)
        if recycled is None:
            self._keep_room_for_one_more()
        path, holder = self._write(version, write, recycled)
        self._files[version] = path
        self._views[version] = weakref.ref(holder)
        self._prune()

    def _keep_room_for_one_more(self) -> None:
        """Refuse (OSError) a new placed file that would leave no room for one more of its
        size: a placed file's pages stay while its snapshot is held (by the pool, by a
        background checkpoint's encoding, by a push to a lagging server), so a third
        file can be pinned where the directory was sized for two; refused, the trainer
        keeps a copy and the push still has room for its own file."""
        sizes = [
            size
            for path in self._files.values()
            if isinstance(path, Path) and (size := _size_or_none(path)) is not None
        ]
        if not sizes:
            return  # the first file: the directory was sized for two
        stats = os.statvfs(self._directory)
        if stats.f_bavail * stats.f_frsize < 2 * max(sizes):
            raise OSError(
                errno.ENOSPC, f"{self._directory}: no room for a held weights file and one more"
            )

    def _viewed(self, version: int) -> bool:
        """Whether something in this process still views ``version``'s file."""
        holder = self._views.get(version)
        return holder is not None and holder() is not None

    def _prune(self) -> None:
        """Forget and delete all but the newest ``keep`` versions and the ones a push is
        loading (files of earlier runs in the directory included, and their partial
        files: a run killed while it wrote one)."""
        keep = set(sorted(self._files)[-self._keep :]) | set(+self._reading)
        # The newest superseded placed file stays, its pages for a later version once
        # nothing views it (its views may be gone already: the pool let its version go
        # before this push's end); others go (a file removed while viewed keeps its
        # pages until the views go).
        keep |= set(sorted(v for v in self._files if v not in keep and v in self._views)[-1:])
        for version in [v for v in self._files if v not in keep]:
            del self._files[version]
            self._file_seconds.pop(version, None)
            self._views.pop(version, None)
        try:
            entries = list(os.scandir(self._directory))
        except OSError:
            return
        sweep, self._swept = not self._swept, True
        for entry in entries:
            match = _FILE.match(entry.name)
            if match and int(match.group(1)) not in keep:
                Path(entry.path).unlink(missing_ok=True)
            partial = _PARTIAL.match(entry.name)
            if sweep and partial and int(partial.group(1)) != os.getpid():
                Path(entry.path).unlink(missing_ok=True)

    async def weights_file(self, version: int, weights: SafetensorsWeights) -> Path:
        """The file of ``version``, written on the first call for it (shared by every
        server's push); a write that failed is retried by the next call."""
        task = self._files.get(version)
        if isinstance(task, Path):
            return task  # placed: written before any push asked for it
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            self.check(version, weights)  # the caller's error, raised in the caller
            recycled = self._recyclable(version)
            size = _file_bytes(weights, self._dtype)
            if size is not None and size <= _WRITE_ON_LOOP_BYTES:
                # Written here: a thread's hand-off back to the job's busy loop took 24 ms
                # at the median in a tiny Llama run, the write of its 0.7 MB file 1 ms.
                task = asyncio.get_running_loop().create_future()
                try:
                    task.set_result(self._write_weights(version, weights, recycled))
                except Exception as error:  # retried by the next call, as a thread's
                    task.set_exception(error)
            else:
                task = asyncio.ensure_future(
                    asyncio.to_thread(self._write_weights, version, weights, recycled)
                )
            self._files[version] = task
            await asyncio.shield(task)
            self._prune()
        return await asyncio.shield(task)

    def _write_weights(
        self, version: int, weights: SafetensorsWeights, recycled: Path | None
    ) -> Path:
        path, _ = self._write(
            version, lambda file: weights.write_safetensors(file, self._dtype), recycled
        )
        return path

    def _recyclable(self, version: int) -> Path | None:
        """The file of a version that writing ``version`` supersedes (the oldest outside
        the newest ``keep``), forgotten here so that its pages can be reused; None if
        every such file is being read by a push or not written whole.

        Safe because nothing maps a file once its push is done: the worker reads it
        through ``safe_open`` (tensors viewing a private mapping of the file), the load
        copies them into the model's parameters or a scratch tensor that oneDNN packs
        into its own memory (the extension's direct load; vLLM's in-place reload, 0.32:
        ``model_loader/reload``, the same) and keeps none, and the worker drops them
        when the load returns. A
        push of that version that starts later writes its file again. A push that
        timed out may still be loading it in the worker: that server then names no
        version and gets no call until a later push, which loads a whole file. A file
        this process still views (:meth:`place`) is not taken either."""
        kept = set(sorted({*self._files, version})[-self._keep :])
        for old in sorted(self._files):
            path = _written(self._files[old])
            if old in kept or self._reading[old] or path is None or self._viewed(old):
                continue
            del self._files[old]
            self._file_seconds.pop(old, None)
            self._views.pop(old, None)
            return path
        return None

    async def prepare(self, version: int, weights: SafetensorsWeights) -> None:
        """Write the file of ``version`` ahead of its pushes (``PreparingWeightSync``):
        the pool does while the server still runs calls, so the push proper is only the
        requests."""
        await self.weights_file(version, weights)

    def push_phases(self, url: str) -> dict[str, float]:
        """Where the newest push to ``url`` spent its seconds (``TimedWeightSync``):
        ``file_s`` (its weights file's write, shared by every server's push; 0.0 when
        an earlier push wrote it; a placed file's write, the trainer's snapshot, was
        done before the push began, outside its ``write_s``) and each request's
        (``pause_s``, ``unname_s``, ``load_s``, ``tag_s``, ``reset_s`` with
        ``on_weight_update = "interrupt"``, ``resume_s``); a failed push has the phases
        it reached."""
        return dict(self._phases.get(url, {}))

    def close(self) -> None:
        """Remove every weight file in the directory, and the directory if that leaves it
        empty (the job's end); pushes still running fail, and nothing is placed after it."""
        self._closed = True
        self._files.clear()
        self._reading.clear()
        self._views.clear()
        with contextlib.suppress(OSError):
            for entry in os.scandir(self._directory):
                if _FILE.match(entry.name) or _PARTIAL.match(entry.name):
                    Path(entry.path).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self._directory.rmdir()

    # -- one push ---------------------------------------------------------------------------

    async def push(
        self,
        client: httpx.AsyncClient,
        url: str,
        version: int,
        weights: SafetensorsWeights,
        timeout: float,
    ) -> int | None:
        return await self._push(client, url, version, weights, timeout, keep_calls=False)

    async def push_keeping_calls(
        self,
        client: httpx.AsyncClient,
        url: str,
        version: int,
        weights: SafetensorsWeights,
        timeout: float,
    ) -> int | None:
        """The push of ``on_weight_update = "interrupt"`` (``InterruptingWeightSync``):
        ``/pause?mode=keep`` freezes the requests in flight between two tokens, and the
        prefix-cache reset preempts them (``reset_running_requests``), so vLLM recomputes
        their KV under the new weights when they resume; their later tokens are the new
        version's, and their ``weight_versions`` spans say from which token."""
        return await self._push(client, url, version, weights, timeout, keep_calls=True)

    async def _push(
        self,
        client: httpx.AsyncClient,
        url: str,
        version: int,
        weights: SafetensorsWeights,
        timeout: float,
        *,
        keep_calls: bool,
    ) -> int | None:
        # Counted before the file is waited for: a newer version written meanwhile
        # prunes on its own, and must not take this one away from the push.
        self._reading[version] += 1
        # Nothing of an earlier push's phases stays readable as this one's if its file
        # fails to be written.
        self._phases[url] = {}
        try:
            path = await self.weights_file(version, weights)
            # The first push of a version reports its file's write; later ones found it.
            phases = self._phases[url] = {"file_s": self._file_seconds.pop(version, 0.0)}
            return await self._requests(client, url, path, version, timeout, keep_calls, phases)
        finally:
            self._reading[version] -= 1
            if self._files:
                self._prune()

    async def _requests(
        self,
        client: httpx.AsyncClient,
        url: str,
        path: Path,
        version: int,
        timeout: float,
        keep_calls: bool,
        phases: dict[str, float],
    ) -> int | None:
        clock = _Phases(phases)
        async with clock("pause_s"):
            await _exchange(
                client,
                "POST",
                f"{url}/pause",
                params={"mode": "keep"} if keep_calls else {"mode": "wait", "clear_cache": "true"},
                timeout=timeout,
            )
        try:
            # A server that kept its old name while it loads would serve mixed weights
            # under it if the load failed half way: no load unless it names none now.
            async with clock("unname_s"):
                unnamed = _decode(await _tag(client, url, LOADING_TAG, timeout), _TagReply)
            if unnamed is None or not unnamed.success:
                return None
            async with clock("load_s"):
                rpc = await _exchange(
                    client,
                    "POST",
                    f"{url}/collective_rpc",
                    json={"method": LOAD_METHOD, "args": [str(path), str(version)]},
                    timeout=timeout,
                )
            if not _loaded(_decode(rpc, _RpcReply), version):
                return None
            crash_point("vllm.push_loaded")
            async with clock("tag_s"):
                tagged = _decode(await _tag(client, url, str(version), timeout), _TagReply)
            if tagged is None or not tagged.success:
                return None
            if keep_calls:
                async with clock("reset_s"):
                    reset = _decode(
                        await _exchange(
                            client,
                            "POST",
                            f"{url}/reset_prefix_cache",
                            # Paused requests hold KV blocks: the reset preempts them
                            # (recomputed on resume), or it would fail while they run.
                            params={"reset_running_requests": "true"},
                            timeout=timeout,
                        ),
                        _ResetReply,
                    )
                if reset is None or not reset.success:
                    return None
        finally:
            async with clock("resume_s"):
                await _resume(client, url)
        return parse_version(tagged.new_version)


def _written(entry: asyncio.Future[Path] | Path) -> Path | None:
    """The path of a file written whole; None while it is written or if that failed."""
    if isinstance(entry, Path):
        return entry
    if not entry.done() or entry.cancelled() or entry.exception() is not None:
        return None
    return entry.result()


class _Phases:
    """Times the blocks it is entered for into ``seconds`` by name, on the loop's clock
    (a block that raises is timed too: a failed push says where it stopped)."""

    def __init__(self, seconds: dict[str, float]) -> None:
        self._seconds = seconds

    @contextlib.asynccontextmanager
    async def __call__(self, name: str) -> AsyncIterator[None]:
        began = monotonic()
        try:
            yield
        finally:
            self._seconds[name] = monotonic() - began


def _loaded(reply: _RpcReply | None, version: int) -> bool:
    """Every worker answered, each naming ``version``."""
    if reply is None or not reply.results:
        return False
    return all(
        isinstance(result, dict) and result.get("version") == str(version)
        for result in reply.results
    )


async def _exchange(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    timeout: float,
    json: Any = None,
    params: dict[str, str] | None = None,
) -> bytes:
    """The reply body; ``httpx.HTTPStatusError`` for a refusal, ``b""`` past the cap."""
    async with client.stream(method, url, json=json, params=params, timeout=timeout) as response:
        response.raise_for_status()
        body = await read_capped(response, _REPLY_CAP)
        return b"" if body is None else body


async def _tag(client: httpx.AsyncClient, url: str, name: str, timeout: float) -> bytes:
    # vLLM takes the version as a string (an int is a 400).
    return await _exchange(
        client, "POST", f"{url}/update_weight_version", json={"new_version": name}, timeout=timeout
    )


async def _resume(client: httpx.AsyncClient, url: str) -> None:
    """Resume the server; a failure is left to the pool (the push already failed or its
    calls time out, and the next push pauses and resumes again)."""
    try:
        async with asyncio.timeout(_RESUME_TIMEOUT_S):
            await _exchange(client, "POST", f"{url}/resume", timeout=_RESUME_TIMEOUT_S)
    except (httpx.HTTPError, TimeoutError):
        pass
