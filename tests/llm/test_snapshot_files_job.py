"""The torch trainer's snapshots as the vLLM sync's files, through the server pool's
pushes (a fake vLLM): each version's push loads the file its snapshot is, and the run
takes turns between two files, as ``VllmWeightSync.place`` says (a fresh file per version
would cost SmolLM2 0.6 s of new shared-memory pages each)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import httpx
import pytest
from http_support import TASKS, EventLog
from llm_support import fixed_batch
from vllm_fake import FakeVllmFleet, file_version

from rollout_recovery.llm._trainer import TorchGRPOTrainer
from rollout_recovery.policy import TaskConfig
from rollout_recovery.policy._tasks import VOCAB_SIZE
from rollout_recovery.rollout import DigitTask, GenerationConfig, HttpConfig, HttpGenerationBackend
from rollout_recovery.vllm._sync import VllmWeightSync, weights_file_name

GUARD_S = 30.0


def file_index(path: Path) -> int:
    return int(path.name.removeprefix("weights-v").removesuffix(".safetensors"))


def test_each_push_loads_the_snapshots_own_file_and_the_run_takes_turns_between_two(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = FakeVllmFleet(1)
    sync = VllmWeightSync(tmp_path / "weights", dtype="float32")
    # Which file each version took (a reused inode number proves nothing on tmpfs).
    taken: list[Path | None] = []
    recyclable = sync._recyclable

    def recording(version: int) -> Path | None:
        taken.append(recyclable(version))
        return taken[-1]

    monkeypatch.setattr(sync, "_recyclable", recording)
    trainer = TorchGRPOTrainer(tiny_model_dir, seed=0)
    trainer.keep_snapshots_in(sync)
    events = EventLog()
    backend = HttpGenerationBackend(
        HttpConfig(servers=tuple(fleet.servers), model="m", probe_interval_s=0.01),
        generation=GenerationConfig(),
        episodes=DigitTask(TASKS, TaskConfig(thinking_calls=1, reasoning_tokens=4)),
        vocab_size=VOCAB_SIZE,
        weight_sync=sync,
        initial_version=0,
        initial_weights=trainer.weights(),
        client=httpx.AsyncClient(transport=fleet.transport()),
        on_event=events,
    )
    url = fleet[0].url

    async def scenario() -> list[tuple[int, str | None]]:
        seen = []
        backend.pool.start()
        for version in range(6):
            if version:
                trainer.train_step(fixed_batch())
                backend.update_weights(trainer.weight_version, trainer.weights())
            await events.wait(lambda v=version: backend.pool.versions()[url] == v, GUARD_S)
            path = sync.directory / weights_file_name(version)
            seen.append((os.stat(path).st_ino, file_version(str(path))))
        await backend.aclose()
        return seen

    seen = asyncio.run(scenario())
    assert [found for _, found in seen] == [str(v) for v in range(6)]
    # 0 and 1 are new files (the pool holds 0 while 1 is placed); then each version
    # takes the file of the version before the one it supersedes.
    assert [None if t is None else file_index(t) for t in taken] == [None, None, 0, 1, 2, 3]
    assert fleet[0].loaded == 5
    sync.close()
