"""Which files of a model directory hold its weights, each one checked before it is read.

A model directory is ``config.json`` and either ``model.safetensors`` or the shards its
``model.safetensors.index.json`` names in ``weight_map``. The index is the directory's own
word, and a directory may come from anywhere: a shard named ``/dev/zero`` made the digest
read for ever, ``../`` read outside the directory, and a ``weight_map`` of ``[]`` was a
traceback. So every file is taken only as a regular file inside the directory (the path
resolved, symlinks included: a link to a file elsewhere is refused), and the index is
decoded into its one expected shape, under a size cap, with an error naming the file and
the entry at fault.

No torch here: the job computes the model's digest (``_model_source``) before it loads
torch, and the trainer reads the shards (``_model_files``) through the same check.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Annotated, Final

import msgspec

from .._messages import split_validation_path
from ..errors import InvalidStateError

__all__ = ["CONFIG", "INDEX", "SINGLE", "model_file", "weight_file_names"]

CONFIG: Final = "config.json"
SINGLE: Final = "model.safetensors"
INDEX: Final = "model.safetensors.index.json"
# A real index is a few MB at most (one short line per tensor); more is not an index.
_INDEX_CAP: Final = 64 * 2**20
# A shard's name as the index may give it: a relative path, no NUL, of a sane length.
_ShardName = Annotated[str, msgspec.Meta(min_length=1, max_length=4096, pattern=r"^[^\x00]+$")]


class _Index(msgspec.Struct):
    weight_map: Annotated[dict[str, _ShardName], msgspec.Meta(min_length=1)]


def _inside(root: Path) -> list[Path]:
    """Where a model directory's files may lead: the directory, and for a snapshot of the
    Hugging Face hub cache (``models--<org>--<name>/snapshots/<revision>``, whose files are
    symlinks into the repo's content-addressed ``blobs``) that repo's ``blobs`` too."""
    repo = root.parent.parent
    if root.parent.name == "snapshots" and repo.name.startswith("models--"):
        return [root, repo / "blobs"]
    return [root]


def model_file(directory: Path, name: str) -> Path:
    """``directory/name`` resolved, when it is a regular file inside ``directory`` (after
    every symlink; a hub cache snapshot's files inside its repo's blobs);
    ``InvalidStateError`` naming the file otherwise."""
    root = Path(directory).resolve()
    wanted = Path(directory) / name
    if Path(name).is_absolute():
        raise InvalidStateError(
            f"{name!r} is an absolute path: a model's files are named inside its directory",
            file=str(wanted),
        )
    try:
        resolved = wanted.resolve(strict=True)
        mode = resolved.stat().st_mode
    except OSError as error:
        raise InvalidStateError(
            f"cannot read {name!r}: {error.strerror or error}", file=str(wanted)
        ) from None
    if not any(resolved.is_relative_to(inside) for inside in _inside(root)):
        raise InvalidStateError(
            f"{name!r} leads outside the model directory (to {resolved}); a model's files "
            "must be inside it",
            file=str(wanted),
        )
    if not stat.S_ISREG(mode):
        raise InvalidStateError(
            f"{name!r} is not a regular file; a model's files must be", file=str(wanted)
        )
    return resolved


def _read_index(directory: Path) -> _Index:
    path = model_file(directory, INDEX)
    size = path.stat().st_size
    if size > _INDEX_CAP:
        raise InvalidStateError(
            f"{INDEX} is {size} bytes, more than an index of weight files can be "
            f"({_INDEX_CAP} at most)",
            file=str(path),
        )
    try:
        return msgspec.json.decode(path.read_bytes(), type=_Index)
    except msgspec.ValidationError as error:
        message, where = split_validation_path(str(error))
        raise InvalidStateError(
            f"{INDEX} is not an index of weight files ({message}): its weight_map must map "
            "each tensor's name to the shard file holding it",
            path=where,
            file=str(path),
        ) from None
    except (msgspec.DecodeError, RecursionError) as error:
        raise InvalidStateError(f"{INDEX} is not JSON: {error}", file=str(path)) from None


def weight_file_names(directory: Path) -> list[str]:
    """The names of the files holding the model's weights, each checked by
    :func:`model_file`: ``model.safetensors`` when it is there, else the index and every
    shard it names (sorted, each once). ``InvalidStateError`` for a directory with
    neither, an index that is not one, or a file that is not a regular file inside it."""
    directory = Path(directory)
    if os.path.lexists(directory / SINGLE):
        model_file(directory, SINGLE)
        return [SINGLE]
    if not os.path.lexists(directory / INDEX):
        raise InvalidStateError(
            f"{directory} has neither {SINGLE} nor {INDEX}: not a model directory",
            file=str(directory),
        )
    shards = sorted(set(_read_index(directory).weight_map.values()))
    for shard in shards:
        model_file(directory, shard)
    return [INDEX, *shards]
