"""Map-style datasets: the one rule that makes an item reproducible anywhere, and the
digest that says which files a dataset was read from.

``item_rng`` is shared by the synthetic task set (``policy``) and the LLM job's
emit-token task (``llm``); ``dataset_digest`` by the dataset task (``llm``), which records
it, and the auditor (``history``), which checks the files against it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Final

import numpy as np

from .errors import InvalidArgumentError, InvalidArgumentTypeError

__all__ = ["dataset_digest", "files_digest", "item_rng", "tokenizer_files"]

_CHUNK: Final = 1 << 20
# What a model directory's tokenizer is made of besides ``tokenizer*`` files (the chat
# template included), and the generation config, whose end-of-sequence ids end a
# completion.
_TOKENIZER_NAMES: Final = (
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
    "merges.txt",
    "special_tokens_map.json",
    "vocab.json",
)


def item_rng(idx: object, *, size: int, seed: int) -> tuple[int, np.random.Generator]:
    """Item ``idx`` of a map-style dataset of ``size`` items, checked, and the generator
    that draws it: one per ``(seed, idx)``, so an item never depends on which items were
    read before it, or in which process (the controller rebuilds prompts after a restart
    and the ledger checks them)."""
    if isinstance(idx, bool) or not isinstance(idx, int | np.integer):
        raise InvalidArgumentTypeError(f"task index must be an int, got {type(idx).__name__}")
    idx = int(idx)
    if not 0 <= idx < size:
        raise IndexError(f"task index {idx} out of range for {size} tasks")
    return idx, np.random.default_rng([seed, idx])


def files_digest(paths: Iterable[Path]) -> str:
    """sha256 (hex) over the files at ``paths`` (a directory: every file under it, by
    relative name), each file's name, size and bytes, in the order given.

    An ``InvalidArgumentError`` naming the path when one is missing or unreadable.
    """
    digest = hashlib.sha256()
    for root in paths:
        root = Path(root)
        if root.is_dir():
            files = sorted(p for p in root.rglob("*") if p.is_file())
            names = [p.relative_to(root).as_posix() for p in files]
        else:
            files, names = [root], [root.name]
        for path, name in zip(files, names, strict=True):
            try:
                size = path.stat().st_size
                digest.update(f"{name}\0{size}\0".encode())
                with open(path, "rb") as handle:
                    while chunk := handle.read(_CHUNK):
                        digest.update(chunk)
            except OSError as error:
                raise InvalidArgumentError(
                    f"cannot read {str(path)!r}: {error.strerror or error}"
                ) from None
    return digest.hexdigest()


def tokenizer_files(model_dir: Path) -> list[Path]:
    """The files of ``model_dir`` that make its tokenizer and chat template."""
    return sorted(
        path
        for path in Path(model_dir).iterdir()
        if path.is_file() and (path.name.startswith("tokenizer") or path.name in _TOKENIZER_NAMES)
    )


def dataset_digest(data: Path, model_dir: Path) -> str:
    """What a dataset task's prompts are made of: the dataset's files (a file, or every
    file of a ``save_to_disk`` directory) and the model's tokenizer files."""
    return files_digest([Path(data), *tokenizer_files(model_dir)])
