"""Exactly once over a user's dataset: a dataset task's journal checked against the data.

For ``[task] kind = "dataset"`` the auditor also checks, from ``job.toml`` and the
history:

- the data is the data the job recorded: the dataset's files and the model's tokenizer
  still have ``[task] digest``, and the file holds the ``[task] dataset_size`` rows the
  order below is checked over (read as the job reads it; a size short of the file's would
  let rows past it go untrained unseen). Files that cannot be read here are reported as
  not checked, not as a violation: the data may live elsewhere;
- every prompt the dataloader took is the row its position gives in the dataloader's
  order (``_sampler``: a seeded permutation of the ``[task] dataset_size`` rows per
  epoch), so each epoch takes each row once;
- no row is trained twice within an epoch (after restores: the training that survived).

With the trail check (positions contiguous, every prompt taken trained, dropped with a
reason or owned by the newest checkpoint), each row of every epoch the run finished is
trained in exactly one group, in the dataloader's order, or dropped with a recorded
reason. The counts say how many rows and whole epochs that is.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from .._datasets import dataset_digest
from .._sampler import dataset_position_to_idx
from ..errors import RolloutRecoveryError
from ..llm import ModelConfig
from ..policy import TaskConfig
from ._journal import JournalEntry
from .records import PromptDropped, PromptTaken, TrainedRow

__all__ = ["check_dataset"]

# More violations of one kind than this are summed up in one line.
_MAX_LISTED = 10


def check_dataset(
    job: Mapping[str, Any],
    entries: Sequence[JournalEntry],
    trained: Sequence[tuple[int, TrainedRow]],
    *,
    journal: str,
) -> tuple[list[str], dict[str, Any]]:
    """Violations and counts of a dataset task's run (none for other tasks): ``job`` is
    the parsed ``job.toml``, ``entries`` the journal, ``trained`` the surviving rows."""
    task = job.get("task")
    if not isinstance(task, Mapping) or task.get("kind") != "dataset":
        return [], {}
    size = task.get("dataset_size")
    seed = (job.get("job") or {}).get("seed", 0)
    if not isinstance(size, int) or not isinstance(seed, int) or size < 1:
        return [f"job.toml records no dataset_size for its dataset task ({size!r})"], {}
    violations: list[str] = []
    digest, in_file = _digest(job, task)
    counts: dict[str, Any] = {"dataset_rows": size, "dataset_digest": digest}
    if digest == "differs":
        violations.append(
            f"the dataset {task.get('path')!r} (with the model's tokenizer) no longer has the "
            f"digest {task.get('digest')} job.toml recorded: the data changed after the run "
            "started"
        )
    elif in_file is not None and in_file != size:
        missed = "rows past it were never taken" if in_file > size else "it names rows not there"
        violations.append(
            f"the dataset {task.get('path')!r} holds {in_file} rows, but job.toml records "
            f"[task] dataset_size = {size}: the dataloader's order covers {size} rows, so "
            f"{missed}"
        )
    taken: dict[str, PromptTaken] = {}
    dropped: set[str] = set()
    wrong: list[str] = []
    for entry in entries:
        record = entry.record
        if isinstance(record, PromptTaken):
            taken.setdefault(record.group_id, record)
            expected = dataset_position_to_idx(record.position, size=size, seed=seed)
            if record.prompt_idx != expected:
                wrong.append(
                    f"group {record.group_id} at position {record.position} took row "
                    f"{record.prompt_idx}, but the dataloader's order gives row {expected} "
                    f"({journal}:{entry.line})"
                )
        elif isinstance(record, PromptDropped):
            dropped.add(record.group_id)
    violations.extend(_listed(wrong, "prompts taken out of the dataloader's order"))
    per_epoch: dict[tuple[int, int], list[str]] = defaultdict(list)  # (epoch, row) -> groups
    for group_id in dict.fromkeys(row.group_id for _, row in trained):
        took = taken.get(group_id)
        if took is not None:
            per_epoch[(took.position // size, took.prompt_idx)].append(group_id)
    twice = [
        f"row {row} of epoch {epoch} trained in groups {groups}"
        for (epoch, row), groups in sorted(per_epoch.items())
        if len(groups) > 1
    ]
    violations.extend(_listed(twice, "rows trained twice in one epoch"))
    # An epoch is complete when each of its rows was trained once or dropped with a reason.
    covered: dict[int, set[int]] = defaultdict(set)
    for (epoch, row), groups in per_epoch.items():
        if len(groups) == 1:
            covered[epoch].add(row)
    for group_id in dropped:
        took = taken.get(group_id)
        if took is not None:
            covered[took.position // size].add(took.prompt_idx)
    complete = [epoch for epoch, rows in covered.items() if len(rows) == size]
    counts.update(
        dataset_rows_trained=sum(1 for groups in per_epoch.values() if groups),
        dataset_rows_dropped=len(dropped),
        dataset_epochs_complete=len(complete),
    )
    return violations, counts


def _listed(found: list[str], what: str) -> list[str]:
    if len(found) <= _MAX_LISTED:
        return found
    return [*found[:_MAX_LISTED], f"... and {len(found) - _MAX_LISTED} more {what}"]


def _digest(job: Mapping[str, Any], task: Mapping[str, Any]) -> tuple[str, int | None]:
    """``"matches"``, ``"differs"``, or ``"not checked: <why>"``; with a match, the rows
    the file holds, read as the job read them (None when they cannot be read here)."""
    recorded, path = task.get("digest"), task.get("path")
    if not recorded or not isinstance(path, str):
        return "not checked: job.toml records no digest", None
    try:
        model = msgspec.convert(job.get("model", {}), ModelConfig)
        digest = dataset_digest(Path(path).expanduser(), model.directory())
    except (RolloutRecoveryError, msgspec.ValidationError, OSError) as error:
        return f"not checked: {error}", None
    if digest != recorded:
        return "differs", None
    try:
        read = model.resolved_dataset(msgspec.convert(dict(task), TaskConfig))
    except (RolloutRecoveryError, msgspec.ValidationError, OSError):
        return "matches", None  # the files hash, but this install cannot read them as rows
    return "matches", read.dataset_size
