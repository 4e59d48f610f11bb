"""An immutable, versioned CPU snapshot of a model's parameters: what generation samples from.

The trainer hands one :class:`TorchWeights` per weight version to the generation side. It
holds its own copies of the parameters (training goes on in place on the trainer's), by
their checkpoint names (``model.layers.0.self_attn.q_proj.weight``; a tied
``lm_head.weight`` is left out, as in a Hugging Face checkpoint). Nothing may change its
tensors: an in-process backend builds its model around them without copying, and a server
loads the file :meth:`write_safetensors` writes (or :meth:`safetensors_bytes`).

Where the servers load a file per version (:class:`SnapshotFiles`, the vLLM sync), the
snapshot can be that file (:meth:`TorchWeights.capture_into`): written once, straight from
the live parameters, and viewed read-only; the copy a snapshot otherwise takes (538 MB for
SmolLM2-135M in fp32, on the step's path) is the file's write.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import warnings
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import BinaryIO, Protocol

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from ..errors import InvalidArgumentError, InvalidArgumentTypeError, InvalidStateError

__all__ = ["SnapshotFiles", "TorchWeights"]

_VERSION_KEY = "weight_version"
# The dtypes a weights file may be written in, by name (what a server config says).
_DTYPE_NAMES = frozenset({"float32", "bfloat16", "float16"})
# Their names in a safetensors header.
_SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
# How a weights file is mapped: shared, its pages faulted in by the one mmap call where
# Linux can (a fault per 4 KB page as the cast reaches it cost 2.2 s against 0.1 s for
# 506 MB in /dev/shm on the loaded 2-core machine).
_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


class TorchWeights:
    """Parameters of one weight version, by name; immutable by contract."""

    __slots__ = ("_tensors", "_version")

    def __init__(self, version: int, tensors: Mapping[str, torch.Tensor]) -> None:
        """Takes ownership of ``tensors`` (use :meth:`capture` to copy a live model's)."""
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise InvalidArgumentError(f"version must be a non-negative int, got {version!r}")
        for name, tensor in tensors.items():
            if not isinstance(tensor, torch.Tensor):
                raise InvalidArgumentTypeError(
                    f"weights {name!r} must be a torch.Tensor, got {type(tensor).__name__}"
                )
            if tensor.device.type != "cpu" or tensor.requires_grad:
                raise InvalidArgumentError(f"weights {name!r} must be a detached CPU tensor")
        self._version = version
        self._tensors: Mapping[str, torch.Tensor] = MappingProxyType(dict(tensors))

    @classmethod
    def capture(cls, version: int, parameters: Iterable[tuple[str, torch.Tensor]]) -> TorchWeights:
        """A snapshot of live parameters (e.g. ``model.named_parameters()``): copies them."""
        with torch.no_grad():
            copied = {name: p.detach().to("cpu", copy=True) for name, p in parameters}
        return cls(version, copied)

    @property
    def version(self) -> int:
        return self._version

    @property
    def tensors(self) -> Mapping[str, torch.Tensor]:
        """Read-only mapping; the tensors themselves must not be changed either."""
        return self._tensors

    @property
    def num_parameters(self) -> int:
        return sum(t.numel() for t in self._tensors.values())

    def __repr__(self) -> str:
        return f"TorchWeights(version={self._version}, tensors={len(self._tensors)})"

    def safetensors_bytes(self, dtype: torch.dtype | str | None = None) -> bytes:
        """The snapshot as a safetensors file (in ``dtype`` if given, e.g. ``bfloat16`` for a
        bf16 server, as a torch dtype or its name); the version is in the file's metadata."""
        target = _dtype(dtype)
        tensors = {
            name: (t if target is None else t.to(target)).contiguous()
            for name, t in self._tensors.items()
        }
        return bytes(save_safetensors(tensors, metadata={_VERSION_KEY: str(self._version)}))

    def write_safetensors(self, file: BinaryIO, dtype: torch.dtype | str | None = None) -> None:
        """Write :meth:`safetensors_bytes`'s file into ``file`` (open for reading and
        writing; it may hold an earlier file's bytes, whose pages are then reused: every
        byte is written and the file sized to this one) without building it in memory
        first: the file is sized (its pages reserved: no room is an OSError, never a
        SIGBUS), mapped with its pages faulted in at once, and each tensor is cast into
        its place in the mapping (one pass over the weights, no copy of the whole file;
        what a push of a 269 MB model into shared memory needs). The caller makes it
        durable, or not, and renames it into place."""
        _write_file(file, self._version, self._tensors, _dtype(dtype))

    @classmethod
    def capture_into(
        cls,
        files: SnapshotFiles,
        version: int,
        parameters: Iterable[tuple[str, torch.Tensor]],
    ) -> TorchWeights:
        """A snapshot of live parameters that *is* ``version``'s file in ``files``: the
        file is written straight from the parameters (one pass, no copy of them first)
        and the snapshot's tensors are read-only views of it (a write into one is a
        SIGSEGV, never a changed snapshot). Where the file's dtype is not the
        parameters' (a bf16 server of an fp32 trainer) the file cannot be the snapshot:
        :meth:`capture`, the file left to the push. So is a file that cannot be written
        (an OSError: no room), whose push then fails as any push whose file fails."""
        live = [(name, p.detach()) for name, p in parameters]
        target = _dtype(files.dtype)
        if any(t.dtype != target or t.device.type != "cpu" for _, t in live):
            return cls.capture(version, live)
        made: list[TorchWeights] = []

        def write(file: BinaryIO) -> object:
            layout, start = _write_file(file, version, dict(live), None)
            mapping, views = _read_only_views(file, layout, start)
            made.append(cls(version, views))
            return mapping  # alive as long as any view: the file's readers in process

        try:
            files.place(version, write)
        except OSError:
            return cls.capture(version, live)
        return made[0]

    @classmethod
    def from_safetensors_bytes(cls, data: bytes) -> TorchWeights:
        """Read back :meth:`safetensors_bytes` (the version from its metadata)."""
        try:
            (header_len,) = struct.unpack("<Q", data[:8])
            metadata = json.loads(data[8 : 8 + header_len]).get("__metadata__") or {}
            version = int(metadata[_VERSION_KEY])
            tensors = load_safetensors(data)
        except (ValueError, KeyError, TypeError, struct.error, SafetensorError) as error:
            raise InvalidStateError(f"not a TorchWeights safetensors file: {error}") from None
        return cls(version, tensors)


class SnapshotFiles(Protocol):
    """Where a version's snapshot may live as the file its servers load (the vLLM weight
    sync's, ``vllm.VllmWeightSync``; structural, so this room names no sync)."""

    @property
    def dtype(self) -> str:
        """The files' dtype, by name (``float32``)."""
        ...

    def place(self, version: int, write: Callable[[BinaryIO], object]) -> None:
        """Make ``version``'s file by ``write(file)`` (``file`` open for reading and
        writing at offset 0; it may hold an older file's bytes) and keep it as that
        version's. ``write`` returns what holds the file's pages for readers in this
        process: the file is never rewritten while that object is alive."""
        ...


# One tensor's place in a safetensors file: (name, dtype, shape, first byte, end byte),
# the bytes counted from the start of the data.
_Entry = tuple[str, torch.dtype, tuple[int, ...], int, int]


def _write_file(
    file: BinaryIO,
    version: int,
    tensors: Mapping[str, torch.Tensor],
    target: torch.dtype | None,
) -> tuple[list[_Entry], int]:
    """Write ``tensors`` (cast to ``target`` if given) as one safetensors file into
    ``file`` (see :meth:`TorchWeights.write_safetensors`); the tensors' places and where
    their data starts."""
    for name, tensor in tensors.items():
        if (target or tensor.dtype) not in _SAFETENSORS_DTYPES:
            raise InvalidArgumentError(f"weights {name!r} are {tensor.dtype}: not writable")
    # Widest elements first (safetensors' own order), so every tensor's offset is a
    # multiple of its element size and its bytes can be viewed as its dtype in place.
    order = sorted(tensors.items(), key=lambda item: (-(target or item[1].dtype).itemsize, item[0]))
    header: dict[str, object] = {"__metadata__": {_VERSION_KEY: str(version)}}
    layout: list[_Entry] = []
    offset = 0
    for name, tensor in order:
        kind = target or tensor.dtype
        end = offset + tensor.numel() * kind.itemsize
        header[name] = {
            "dtype": _SAFETENSORS_DTYPES[kind],
            "shape": list(tensor.shape),
            "data_offsets": [offset, end],
        }
        layout.append((name, kind, tuple(tensor.shape), offset, end))
        offset = end
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-aligned
    start = 8 + len(encoded)
    size = start + offset
    fd = file.fileno()
    cast = target is not None and any(tensor.dtype != target for _, tensor in order)
    if offset and hasattr(os, "posix_fallocate") and (cast or _allocated(fd) < size):
        # The file's pages reserved now: on a full tmpfs (Docker's /dev/shm is 64 MB)
        # this is an OSError (ENOSPC, a failed push), where a write through the
        # mapping into a page that cannot be had kills the process with SIGBUS. (A
        # file written whole before has its pages: 21 ms of 538 MB saved, and a write
        # that cannot get a page is an OSError anyway.)
        os.posix_fallocate(fd, 0, size)
    file.truncate(size)
    if not cast:
        # No cast: each tensor written from its own memory into its place. No mapping to
        # fault in and tear down (538 MB into a reused file in /dev/shm: 0.10 s against
        # 0.13 s through a mapping, on the loaded 2-core machine).
        _write_at(fd, struct.pack("<Q", len(encoded)) + encoded, 0)
        for (_, _, _, first, _), (_, tensor) in zip(layout, order, strict=True):
            if tensor.numel():
                flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
                _write_at(fd, flat.numpy().data, start + first)
        return layout, start
    with mmap.mmap(file.fileno(), start + offset, flags=_MAP_FLAGS) as mapped:
        mapped[:start] = struct.pack("<Q", len(encoded)) + encoded
        data = torch.frombuffer(mapped, dtype=torch.uint8)
        try:
            with torch.no_grad():
                for (_, kind, shape, first, last), tensor in zip(
                    layout, (t for _, t in order), strict=True
                ):
                    place = data[start + first : start + last].view(kind)
                    place.view(shape).copy_(tensor)
                    del place
        finally:
            del data  # the mapping closes only once no tensor views it
    return layout, start


def _allocated(fd: int) -> int:
    """The bytes of storage the file has (its pages, on tmpfs)."""
    return os.fstat(fd).st_blocks * 512


def _write_at(fd: int, data: memoryview | bytes, offset: int) -> None:
    """All of ``data`` into the file at ``offset`` (a write may take part of it)."""
    view = memoryview(data).cast("B")
    while view:
        done = os.pwrite(fd, view, offset)
        view, offset = view[done:], offset + done


def _read_only_views(
    file: BinaryIO, layout: list[_Entry], start: int
) -> tuple[mmap.mmap, dict[str, torch.Tensor]]:
    """The tensors of the file just written (``layout``, data from ``start``) as views of
    one read-only shared mapping of it (its pages faulted in as they are read: nothing
    here reads them on the step's path)."""
    size = start + (layout[-1][4] if layout else 0)
    mapping = mmap.mmap(file.fileno(), size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    with warnings.catch_warnings():
        # torch warns that it cannot forbid writes: the mapping does (PROT_READ).
        warnings.simplefilter("ignore", UserWarning)
        data = torch.frombuffer(mapping, dtype=torch.uint8)
    views = {
        name: data[start + first : start + last].view(kind).view(shape)
        for name, kind, shape, first, last in layout
    }
    return mapping, views


def _dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    """A dtype given by name (what a server config says) as torch's."""
    if not isinstance(dtype, str):
        return dtype
    named = getattr(torch, dtype, None) if dtype in _DTYPE_NAMES else None
    if not isinstance(named, torch.dtype):
        raise InvalidArgumentError(f"dtype must be one of {sorted(_DTYPE_NAMES)}, got {dtype!r}")
    return named
