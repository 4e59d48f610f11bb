"""The main job with ``generation.backend = "ray"``: actors and shards die, the job does not.

In process, on the module's Ray cluster: while the job runs, the test kills a generation
actor with ``ray.kill``, SIGKILLs another actor's process and kills a data shard actor.
The job must finish without a restart and the audit must show no sibling trained twice,
none lost, and sealed siblings kept. Then the whole controller: SIGKILL of
``rollout-recovery run --backend ray`` (its own local cluster), rerun, audit.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from run_fixtures import backend_events, merge_sections

ray = pytest.importorskip("ray")

from rollout_recovery.cluster._pool import RayGenerationBackend  # noqa: E402
from rollout_recovery.cluster._sharded_plane import RayShardedDataPlane  # noqa: E402
from rollout_recovery.control import RunConfig  # noqa: E402
from rollout_recovery.dataplane import DataPlane  # noqa: E402
from rollout_recovery.history import audit_run  # noqa: E402
from rollout_recovery.job import JobComponents, run_job  # noqa: E402
from rollout_recovery.job._components import default_components  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]

RAY_JOB: dict[str, dict[str, Any]] = {
    "job": {"steps": 16},
    # Calls slow enough that attempts are always in flight when an actor is killed.
    "generation": {"backend": "ray", "call_latency_s": 0.1, "attempt_deadline_s": 10.0},
    # Kills are seen at once (the actor's calls fail); a long ping timeout only keeps a
    # loaded machine's slow but live actors from being declared dead as well.
    "ray": {
        "actors_per_node": 3,
        "cpus_per_actor": 0.01,
        "cpus_per_shard": 0.01,
        "ping_timeout_s": 30.0,
    },
    # Starting Ray workers is slow on a loaded 2-core machine (over 60 s for step 0 with
    # two CPU hogs beside the suite): a hang still fails, just later.
    "liveness": {"step_timeout_s": 300.0},
}
#: For the CLI runs: the same slack.
CLI_TIMEOUT_S = 480.0


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    ray.init(
        num_cpus=2, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False
    )
    yield
    ray.shutdown()


class _Killer:
    """A RunProgress that kills parts of the cluster at given steps (on the job's loop)."""

    def __init__(self) -> None:
        self.backend: RayGenerationBackend | None = None
        self.plane: RayShardedDataPlane | None = None
        self.done: list[str] = []

    def start(self, total_steps: int, resumed_from: int | None) -> None:
        pass

    def log(self, message: str) -> None:
        pass

    def update(self, *, step: int, **_: Any) -> None:
        assert self.backend is not None and self.plane is not None
        # The busiest live actor, so the kill lands mid-attempt; if none is busy at this
        # step boundary, the next step tries again.
        load = self.backend.actor_load()
        busiest = max(load, key=lambda name: load[name]) if load else None
        handles = self.backend.live_actors()
        if busiest is None or load[busiest] == 0:
            return
        if step >= 3 and "ray.kill" not in self.done:
            ray.kill(handles[busiest], no_restart=True)
            self.done.append("ray.kill")
        elif step >= 6 and "sigkill" not in self.done:
            os.kill(self.backend.telemetry()["actors"][busiest]["pid"], signal.SIGKILL)
            self.done.append("sigkill")
        elif step >= 9 and "shard" not in self.done:
            ray.kill(self.plane._handle(0), no_restart=True)
            self.done.append("shard")


def test_actor_and_shard_deaths_cost_no_restart_and_no_sample(
    tmp_path: Path,
    fast_config: Callable[..., RunConfig],
    read_jsonl: Callable[[Path], list[dict[str, Any]]],
) -> None:
    config = fast_config(RAY_JOB)
    killer = _Killer()

    def components(resolved: RunConfig, data_plane: DataPlane) -> JobComponents:
        parts = default_components(resolved, data_plane)
        assert isinstance(parts.backend, RayGenerationBackend)
        assert isinstance(data_plane, RayShardedDataPlane)
        killer.backend, killer.plane = parts.backend, data_plane
        return parts

    out = tmp_path / "run"
    result = run_job(out, config, progress=killer, components=components)
    assert killer.done == ["ray.kill", "sigkill", "shard"]
    assert result.summary.steps == config.job.steps
    # The summary's per-actor table: dead actors and their replacements, with counts.
    states = {name: part["state"] for name, part in result.summary.parts.items()}
    assert list(states.values()).count("dead") >= 2 and "live" in states.values()
    report = audit_run(out)
    assert report.ok, report.violations
    events = read_jsonl(out / "events.jsonl")
    dead = backend_events(events, "actor_dead")
    assert len(dead) >= 2
    assert len([e for e in backend_events(events, "actor_started") if e["replaces"]]) >= 2
    abandoned = [
        attempt for e in events if e["event"] == "attempts_abandoned" for attempt in e["attempts"]
    ]
    assert any("actor_died" in e["reason"] for e in abandoned), (
        dead,
        [e["reason"] for e in abandoned],
    )
    metrics = read_jsonl(out / "metrics.jsonl")
    backend = metrics[-1]["backend"]
    assert backend["replacements"] >= 2 and backend["shard_restarts"] >= 1
    # The audit covers "none twice, none lost, sealed kept"; no run restarted.
    assert [e["event"] for e in read_jsonl(out / "run_log.jsonl")] == ["start"]


def test_sigkill_the_ray_controller_and_rerun(
    tmp_path: Path,
    write_config: Callable[..., Path],
    run_cli_until: Callable[..., subprocess.CompletedProcess[str]],
    run_cli: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    out = tmp_path / "run"
    # 8 steps, not 16: the time went to the Ray start of both children and to steps after
    # the restore that no assertion reads.
    config = write_config(merge_sections(RAY_JOB, {"job": {"steps": 8}}))
    args = ["--out", str(out), "--config", str(config), "--plain"]

    def second_checkpoint(line: str, lines: list[str]) -> bool:
        # "step 2 (3/8 done) ... checkpoints=2": the bootstrap checkpoint is number 1, so a
        # checkpoint of trained steps is committed, and 5 steps remain: the job cannot end
        # before the SIGKILL lands.
        return line.startswith("step ") and int(line.rsplit("checkpoints=", 1)[1]) >= 2

    killed = run_cli_until(args, stop=second_checkpoint, timeout=CLI_TIMEOUT_S)
    assert killed.returncode == -signal.SIGKILL, killed.stdout
    latest = (out / "checkpoints" / "LATEST").read_text().strip()
    assert latest != "step_000000", latest
    finished = run_cli(args, timeout=CLI_TIMEOUT_S)
    assert finished.returncode == 0, finished.stdout
    assert f"resumed from {latest}" in finished.stdout
    report = audit_run(out)
    assert report.ok, report.violations
    assert report.counts.get("restores", 0) >= 1
