"""The dataloader's order is O(1) per prompt, whatever the dataset's size (issue 15, item 8).

It used to permute the whole dataset for every prompt taken (511 ms a prompt at 10M
prompts). ``dataset_position_to_idx`` is now a keyed bijection evaluated one index at a
time: each epoch is a permutation of the dataset (every prompt exactly once), a seed or an
epoch is another order, and a prompt costs the same CPU time at ten prompts as at 10**12.
A real job over a dataset of 10**9 prompts runs as fast as over the default 4096.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollout_recovery._sampler import dataset_position_to_idx
from rollout_recovery.control import RunConfig
from rollout_recovery.errors import InvalidArgumentError
from rollout_recovery.history._trail_check import check_trail
from rollout_recovery.history._trail_reader import read_records
from rollout_recovery.history.records import PromptTaken
from rollout_recovery.job import run_job

SEEDS = st.integers(min_value=0, max_value=2**63 - 1)


def _epoch(size: int, seed: int, epoch: int) -> list[int]:
    start = epoch * size
    return [dataset_position_to_idx(p, size=size, seed=seed) for p in range(start, start + size)]


@given(size=st.integers(min_value=1, max_value=700), seed=SEEDS, epoch=st.integers(0, 10**6))
def test_each_epoch_is_a_permutation_of_the_dataset(size: int, seed: int, epoch: int) -> None:
    assert sorted(_epoch(size, seed, epoch)) == list(range(size))


@given(size=st.integers(min_value=1, max_value=2**40), position=st.integers(0, 2**62), seed=SEEDS)
def test_every_position_maps_into_the_dataset_and_is_a_pure_function(
    size: int, position: int, seed: int
) -> None:
    idx = dataset_position_to_idx(position, size=size, seed=seed)
    assert 0 <= idx < size
    assert dataset_position_to_idx(position, size=size, seed=seed) == idx


@given(size=st.integers(min_value=50, max_value=400), seed=SEEDS)
def test_another_epoch_or_seed_is_another_order(size: int, seed: int) -> None:
    first = _epoch(size, seed, 0)
    assert _epoch(size, seed, 1) != first
    assert _epoch(size, seed + 1, 0) != first
    assert first != list(range(size))  # shuffled, not the identity


# A prompt costs microseconds; the old sampler spent 511 ms a prompt at 10**7 prompts (and
# would need 8 GB at 10**9). The bound is CPU time of this process, so a loaded machine
# does not inflate it, and 50 times what a prompt costs here.
CPU_BUDGET_PER_PROMPT_S = 1e-3
PROMPTS = 300


@pytest.mark.parametrize("size", [10, 10**7, 10**9, 10**12 + 39])
def test_a_prompt_costs_bounded_cpu_time_at_any_dataset_size(size: int) -> None:
    budget = CPU_BUDGET_PER_PROMPT_S * PROMPTS
    # Positions across epochs and offsets; the per-epoch keys are cached, so both a new
    # epoch and the next position of the same epoch are measured.
    positions = [size * (i % 7) + (i * 2654435761) % size for i in range(PROMPTS)]
    started = time.process_time()
    for position in positions:
        idx = dataset_position_to_idx(position, size=size, seed=1234)
        assert 0 <= idx < size
        spent = time.process_time() - started
        # Checked after every prompt: a sampler proportional to the dataset fails at its
        # first prompt instead of running for minutes.
        assert spent <= budget, f"{spent:.3f} s of CPU for prompts at size {size}"


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(InvalidArgumentError):
        dataset_position_to_idx(0, size=0, seed=0)
    with pytest.raises(InvalidArgumentError):
        dataset_position_to_idx(-1, size=10, seed=0)


def test_a_job_over_a_billion_prompts_takes_them_in_constant_time(
    tmp_path: Path, fast_config: Callable[..., RunConfig]
) -> None:
    def run(size: int) -> tuple[float, list[int]]:
        out = tmp_path / f"run-{size}"
        config = fast_config({"job": {"steps": 4}, "task": {"dataset_size": size}})
        started = time.process_time()
        result = run_job(out, config)
        spent = time.process_time() - started
        assert result.summary.steps == 4
        report = check_trail(out / "events.jsonl")
        assert report.ok, report.violations
        taken = [
            record.prompt_idx
            for _, record in read_records(out / "events.jsonl")
            if isinstance(record, PromptTaken)
        ]
        return spent, taken

    small, _ = run(4096)
    huge, taken = run(10**9)
    # The prompts really come from the whole billion, and none is taken twice.
    assert len(taken) == len(set(taken)) >= 16
    assert max(taken) > 10**8
    assert huge < 2 * small + 1.0, (huge, small)
