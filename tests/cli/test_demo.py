"""The demo walks every step and shows sealed work surviving failure and restart."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from rollout_recovery.checkpoint._torch_pt import read_torch_pt
from rollout_recovery.cli._main import cli
from rollout_recovery.ledger import parse_rollout_recovery_state

STEPS = (
    "reserve",
    "admit and dispatch",
    "partial seal",
    "worker failure",
    "retry",
    "checkpoint",
    "restart",
    "redispatch",
    "last seals",
)


def _step_blocks(output: str) -> dict[str, str]:
    parts = re.split(r"^step \d+: ", output, flags=re.MULTILINE)[1:]
    return {part.splitlines()[0].strip(): part for part in parts}


def test_demo_prints_every_step_and_ends_ready(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["demo", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    blocks = _step_blocks(result.output)
    assert list(blocks) == list(STEPS)
    assert blocks["last seals"].count("ready_to_finalize") == 2
    assert "ledger owns 10 staged rows" in blocks["last seals"]


def test_demo_reuses_sealed_attempts_across_the_restart(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["demo", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    blocks = _step_blocks(result.output)
    sealed_before = re.findall(r"([0-9a-f]{6}):sealed", blocks["partial seal"])
    assert len(sealed_before) == 2
    for attempt in sealed_before:
        # The same physical attempt is still the sealed one after restart and last seals.
        assert f"{attempt}:sealed" in blocks["restart"]
        assert f"{attempt}:sealed" in blocks["last seals"]


def test_demo_checkpoint_file_is_a_valid_sidecar(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["demo", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    parsed = parse_rollout_recovery_state(read_torch_pt(tmp_path / "rollout_recovery.pt"))
    assert [g["group_id"] for g in parsed.ledger_state["groups"]] == ["prompt-7", "prompt-8"]
    assert parsed.sampler_stamps_target_steps is True
