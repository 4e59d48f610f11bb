"""A dataset of one's own (``[task] kind = "dataset"``), read with the `datasets` library.

``[task] path`` is a JSONL, JSON, Parquet or CSV file (the loader is chosen by its
suffix: `datasets`' ``json``, ``parquet`` and ``csv`` builders) or a directory written by
``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` (``load_from_disk``; a
``DatasetDict`` gives ``[task] split``). Rows are in the file's order: row ``i`` is
dataset index ``i``, which the dataloader permutes per epoch (``_sampler``).

The job identifies the data by a digest, not by where it is (:func:`resolve_dataset`):
sha256 over the dataset's files and the model's tokenizer files, which make the prompts'
tokens. It is recorded in ``[task] digest`` with the row count in ``[task]
dataset_size`` at the first start, so a rerun against changed data is another job and
is refused: exactly once over a dataset needs the same dataset.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import msgspec

from .._datasets import dataset_digest
from ..errors import ConfigError, InvalidArgumentError
from ..policy import TaskConfig

__all__ = ["DATASETS_HINT", "load_rows", "resolve_dataset"]

DATASETS_HINT: Final = (
    "the dataset task reads its data with the `datasets` library: pip install "
    "'rollout-recovery[llm]' (or pip install 'datasets>=5.2')"
)
_BUILDERS: Final = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def _require_datasets() -> Any:
    if importlib.util.find_spec("datasets") is None:
        raise ConfigError(DATASETS_HINT, path="$.task.kind")
    import datasets

    # The loaders' progress bars would interleave with the run's own output.
    datasets.disable_progress_bars()
    return datasets


def load_rows(task: TaskConfig) -> Any:
    """The ``datasets.Dataset`` at ``[task] path`` with the prompt (or messages) column
    checked; ``ConfigError`` naming the field otherwise."""
    if not task.path:
        raise ConfigError(
            '[task] kind = "dataset" needs [task] path: a JSONL, JSON, Parquet or CSV file '
            "or a save_to_disk directory",
            path="$.task.path",
        )
    datasets = _require_datasets()
    path = Path(task.path).expanduser()
    try:
        if path.is_dir():
            loaded = datasets.load_from_disk(str(path))
            if isinstance(loaded, datasets.DatasetDict):
                if task.split not in loaded:
                    raise ConfigError(
                        f"{str(path)!r} holds the splits {sorted(loaded)}, not {task.split!r}",
                        path="$.task.split",
                    )
                loaded = loaded[task.split]
        elif path.is_file():
            builder = _BUILDERS.get(path.suffix.lower())
            if builder is None:
                raise ConfigError(
                    f"{str(path)!r}: the dataset task reads {', '.join(sorted(_BUILDERS))} "
                    "files or a save_to_disk directory",
                    path="$.task.path",
                )
            loaded = datasets.load_dataset(builder, data_files=str(path), split="train")
        else:
            raise ConfigError(f"{str(path)!r} does not exist", path="$.task.path")
    except ConfigError:
        raise
    except Exception as error:  # the library's own errors: unreadable, malformed rows
        raise ConfigError(
            f"{str(path)!r} could not be read as a dataset: {type(error).__name__}: {error}",
            path="$.task.path",
        ) from None
    _check_columns(task, list(loaded.column_names), len(loaded), str(path))
    return loaded


def _check_columns(task: TaskConfig, columns: list[str], rows: int, where: str) -> None:
    if rows == 0:
        raise ConfigError(f"{where!r} has no rows", path="$.task.path")
    field, key = (
        (task.messages_field, "$.task.messages_field")
        if task.messages_field
        else (task.prompt_field, "$.task.prompt_field")
    )
    if field not in columns:
        raise ConfigError(
            f"{where!r} has no column {field!r}; its columns are {columns}", path=key
        )


def resolve_dataset(
    task: TaskConfig, model_dir: Path, *, log: Callable[[str], None] = lambda _: None
) -> TaskConfig:
    """``task`` with ``digest`` and ``dataset_size`` taken from the data (and the model's
    tokenizer); a ``ConfigError`` when a pinned digest differs."""
    rows = load_rows(task)
    path = Path(task.path).expanduser()
    try:
        digest = dataset_digest(path, model_dir)
    except InvalidArgumentError as error:
        raise ConfigError(str(error), path="$.task.path") from None
    if task.digest and task.digest != digest:
        raise ConfigError(
            f"the dataset {str(path)!r} (with the model's tokenizer) has digest {digest}, not "
            f"the {task.digest} this job was started with: the data changed (restore it, or "
            "start a new run in another directory)",
            path="$.task.digest",
        )
    log(f"dataset {path}: {len(rows)} rows (sha256 {digest[:16]}...)")
    return msgspec.structs.replace(task, digest=digest, dataset_size=len(rows))
