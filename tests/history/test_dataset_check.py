"""The auditor's dataset check (issue 27 item 1): a dataset task's journal against its
data. Each violation it exists for is made here by hand and found: a prompt out of the
dataloader's order, a row trained twice in an epoch, data changed since the run
recorded it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rollout_recovery._datasets import dataset_digest
from rollout_recovery._sampler import dataset_position_to_idx
from rollout_recovery.history._dataset_check import check_dataset
from rollout_recovery.history._journal import JournalEntry
from rollout_recovery.history.records import PromptDropped, PromptTaken, TrainedRow

SIZE, SEED = 5, 7


def _job(**task: Any) -> dict[str, Any]:
    return {"job": {"seed": SEED}, "task": {"kind": "dataset", "dataset_size": SIZE, **task}}


def _taken(position: int, idx: int | None = None) -> PromptTaken:
    row = dataset_position_to_idx(position, size=SIZE, seed=SEED) if idx is None else idx
    return PromptTaken(group_id=f"g{position}", prompt_idx=row, position=position, batch=0)


def _entries(records: list[Any]) -> list[JournalEntry]:
    return [JournalEntry(offset=10 * i, line=i + 1, record=r) for i, r in enumerate(records)]


def _row(group: str, idx: int) -> tuple[int, TrainedRow]:
    row = TrainedRow(
        group_id=group,
        generation_index=0,
        prompt_idx=idx,
        rollout_id=f"{group}_g0_a0",
        valid=True,
        reward=1.0,
        weight_version=1,
    )
    return 0, row


def _check(records: list[Any], trained: list[tuple[int, TrainedRow]], **task: Any) -> Any:
    return check_dataset(_job(**task), _entries(records), trained, journal="events.jsonl")


def test_two_whole_epochs_in_the_dataloaders_order_pass() -> None:
    records = [_taken(p) for p in range(2 * SIZE)]
    trained = [_row(r.group_id, r.prompt_idx) for r in records]
    violations, counts = _check(records, trained)
    assert violations == []
    assert counts["dataset_rows"] == SIZE and counts["dataset_epochs_complete"] == 2
    assert counts["dataset_rows_trained"] == 2 * SIZE
    assert counts["dataset_digest"] == "not checked: job.toml records no digest"


def test_a_dropped_row_still_completes_its_epoch() -> None:
    records: list[Any] = [_taken(p) for p in range(SIZE)]
    dropped = records[2]
    records.append(
        PromptDropped(
            group_id=dropped.group_id,
            prompt_idx=dropped.prompt_idx,
            target_step=0,
            reason="retry_budget_exhausted",
        )
    )
    trained = [_row(r.group_id, r.prompt_idx) for r in records[:SIZE] if r is not dropped]
    violations, counts = _check(records, trained)
    assert violations == [] and counts["dataset_epochs_complete"] == 1
    assert counts["dataset_rows_dropped"] == 1


def test_a_prompt_out_of_the_dataloaders_order_is_a_violation() -> None:
    good = dataset_position_to_idx(3, size=SIZE, seed=SEED)
    records = [_taken(p) for p in range(3)] + [_taken(3, idx=(good + 1) % SIZE)]
    violations, _ = _check(records, [])
    assert len(violations) == 1
    assert (
        f"took row {(good + 1) % SIZE}, but the dataloader's order gives row {good}"
        in (violations[0])
    )
    assert "events.jsonl:4" in violations[0]


def test_a_row_trained_twice_in_one_epoch_is_a_violation() -> None:
    records = [_taken(p) for p in range(SIZE)]
    trained = [_row(r.group_id, r.prompt_idx) for r in records]
    # Another group of the same epoch trained on row 0's prompt (a journal altered or a
    # controller bug: the position check alone misses a group never taken).
    twin = PromptTaken(group_id="twin", prompt_idx=records[0].prompt_idx, position=1, batch=0)
    violations, counts = _check([*records, twin], [*trained, _row("twin", twin.prompt_idx)])
    assert any("trained in groups" in v and "epoch 0" in v for v in violations)
    assert counts["dataset_epochs_complete"] == 0


@pytest.mark.parametrize("changed", [False, True])
def test_the_data_is_checked_against_its_digest(
    tmp_path: Path, tiny_files: tuple[Path, Path], changed: bool
) -> None:
    data, model_dir = tiny_files
    recorded = dataset_digest(data, model_dir)
    if changed:
        data.write_text(data.read_text() + '{"prompt": "new"}\n')
    job = _job(digest=recorded, path=str(data))
    job["model"] = {"source": str(model_dir)}
    violations, counts = check_dataset(job, _entries([]), [], journal="events.jsonl")
    assert counts["dataset_digest"] == ("differs" if changed else "matches")
    assert bool(violations) is changed


@pytest.mark.parametrize("recorded", [SIZE - 1, SIZE + 1])
def test_a_dataset_size_that_is_not_the_files_is_a_violation(
    tiny_files: tuple[Path, Path], recorded: int
) -> None:
    """The order is checked over job.toml's ``dataset_size``: one short of the file's rows,
    a whole run in that order passes every other check while the file's last row is
    skipped in every epoch. The file is read again, and its row count is the size."""
    pytest.importorskip("datasets")
    data, model_dir = tiny_files
    job: dict[str, Any] = {
        "job": {"seed": SEED},
        "task": {
            "kind": "dataset",
            "dataset_size": recorded,
            "digest": dataset_digest(data, model_dir),
            "path": str(data),
        },
        "model": {"source": str(model_dir)},
    }
    records = [
        PromptTaken(
            group_id=f"g{p}",
            prompt_idx=dataset_position_to_idx(p, size=recorded, seed=SEED),
            position=p,
            batch=0,
        )
        for p in range(2 * recorded)
    ]
    trained = [_row(r.group_id, r.prompt_idx) for r in records]
    violations, counts = check_dataset(job, _entries(records), trained, journal="events.jsonl")
    assert counts["dataset_digest"] == "matches"
    assert len(violations) == 1, violations
    assert f"holds {SIZE} rows, but job.toml records [task] dataset_size = {recorded}" in (
        violations[0]
    )


@pytest.fixture
def tiny_files(tmp_path: Path) -> tuple[Path, Path]:
    """A data file of SIZE rows and a directory with a tokenizer file: what the digest
    reads."""
    data = tmp_path / "data.jsonl"
    data.write_text("".join(f'{{"prompt": "{n}+1="}}\n' for n in range(SIZE)))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "tokenizer.json").write_text("{}")
    return data, model


def test_another_task_is_not_checked() -> None:
    assert check_dataset({"task": {"kind": "digits"}}, [], [], journal="x") == ([], {})
