"""Helpers of the dataset task's tests: one small table written in every format the task
reads, a reward file, and a dataset job's config."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

#: Twelve arithmetic rows; "answer" and "level" are the fields the reward gets by name.
ROWS: list[dict[str, Any]] = [
    {"prompt": f"{a}+{b}=", "answer": a + b, "level": "easy" if a + b < 5 else "hard"}
    for a in range(4)
    for b in range(3)
]
FORMATS = ("jsonl", "json", "parquet", "csv", "disk", "disk_dict")


def write_dataset(directory: Path, fmt: str, rows: list[dict[str, Any]] | None = None) -> Path:
    """``rows`` (default :data:`ROWS`) in format ``fmt``; returns the ``[task] path``."""
    rows = ROWS if rows is None else rows
    directory.mkdir(parents=True, exist_ok=True)
    if fmt == "jsonl":
        path = directory / "data.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        return path
    if fmt == "json":
        path = directory / "data.json"
        path.write_text(json.dumps(rows))
        return path
    if fmt == "csv":
        path = directory / "data.csv"
        header = list(rows[0])
        lines = [",".join(header)] + [",".join(str(row[k]) for k in header) for row in rows]
        path.write_text("\n".join(lines) + "\n")
        return path
    import datasets

    table = datasets.Dataset.from_list(rows)
    if fmt == "parquet":
        path = directory / "data.parquet"
        table.to_parquet(str(path))
        return path
    path = directory / "saved"
    if fmt == "disk":
        table.save_to_disk(str(path))
    else:
        other = datasets.Dataset.from_list(rows[:2])
        datasets.DatasetDict({"train": table, "test": other}).save_to_disk(str(path))
    return path


#: A verifiable reward with two components: the first number right, and the format.
REWARD = """
    import re

    def score(completion, answer, level, completion_ids, prompt):
        match = re.search(r"\\d+", completion)
        right = float(match is not None and int(match.group()) == int(answer))
        return {"correct": right, "short": 0.1 * (len(completion_ids) <= 4)}
"""


def write_reward(directory: Path, body: str = REWARD, name: str = "reward.py") -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(body))
    return path


def dataset_job_toml(
    *,
    data: Path,
    reward: str,
    model_cache: Path,
    steps: int = 3,
    prompts: int = 4,
    group: int = 2,
    extra: str = "",
) -> str:
    """A small dataset job on the tiny Llama, sampled in process."""
    return f"""
[job]
steps = {steps}
prompts_per_step = {prompts}
generations_per_prompt = {group}
staleness_window = 0
seed = 3

[task]
kind = "dataset"
path = "{data}"
max_tokens = 3

[reward]
function = "{reward}"

[model]
source = "tiny-llama"
cache_dir = "{model_cache}"

[trainer]
kind = "torch"
learning_rate = 5e-3
threads = 1

[generation]
backend = "transformers"
max_inflight_attempts = 16
attempt_deadline_s = 120.0

[checkpoint]
every_steps = 1
keep = 2

[liveness]
step_timeout_s = 300.0
train_step_timeout_s = 120.0
{extra}
"""
