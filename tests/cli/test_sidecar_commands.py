"""``rollout-recovery inspect | validate | convert`` through click's CliRunner."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sidecar_fixtures import rich_state

from rollout_recovery.checkpoint import write_sidecar
from rollout_recovery.checkpoint._sidecar_io import (
    NATIVE_SIDECAR_FILENAME,
    encode_sidecar,
    read_sidecar,
)
from rollout_recovery.cli._main import cli

STATE = rich_state()


def run(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args))


@pytest.fixture(params=["native", "pt"])
def sidecar(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    path = tmp_path / f"side-{request.param}.bin"  # a name that says nothing of the format
    write_sidecar(path, STATE, format=request.param)
    return path


def test_commands_are_registered() -> None:
    assert {"inspect", "validate", "convert"} <= set(cli.commands)


def test_inspect_plain_text(sidecar: Path) -> None:
    result = run("inspect", str(sidecar))
    assert result.exit_code == 0, result.output
    out = result.output
    assert "groups                  4" in out
    assert "by status             generating=3, ready_to_finalize=1" in out
    assert "by phase              admitted=3, reserved=1" in out
    assert "by granularity        prompt_group=1, sibling=3" in out
    assert "attempts per sibling  1=10, 2=4" in out
    assert "shortfall by step       0=1, 5=2" in out
    assert "penalize_unwanted_tokens" in out
    assert "reward_mean" in out


def test_inspect_json(sidecar: Path) -> None:
    result = run("inspect", "--json", str(sidecar))
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["groups"]["total"] == 4
    assert summary["siblings"] == {
        "total": 14,
        "sealed": 6,
        "current_attempts_by_status": {"reserved": 8, "sealed": 6},
        # Groups 1 and 3 each retried two siblings.
        "attempts_per_sibling": {"1": 10, "2": 4},
        "attempts_total": 18,
    }
    # Group 2: four sealed siblings with 1+2+3+1 calls; group 1: one with one call.
    assert summary["staging_keys"] == {"expected": 8, "sealed_without_receipt": 1}
    assert summary["shortfall_by_step"] == {"0": 1, "5": 2}
    assert summary["finalizer"]["groups"] == 1
    assert summary["finalizer"]["reward_observations"] == 2
    assert summary["format"] == ("native" if "native" in sidecar.name else "pt")


def test_inspect_checkpoint_directory(tmp_path: Path) -> None:
    write_sidecar(tmp_path / NATIVE_SIDECAR_FILENAME, STATE)
    result = run("inspect", "--json", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["format"] == "native"


def test_validate_valid(sidecar: Path) -> None:
    result = run("validate", str(sidecar))
    assert result.exit_code == 0, result.output
    assert "valid" in result.output


@pytest.mark.parametrize("fmt", ["native", "pt"])
def test_validate_lists_every_problem_with_its_path(tmp_path: Path, fmt: str) -> None:
    state = copy.deepcopy(STATE)
    state["groups"][1]["siblings"][2]["attempts"][1]["status"] = "bogus"
    state["groups"][2]["siblings"][0]["attempts"][0]["staging_keys"] = ["x"]
    state["groups"][3]["group_id"] = state["groups"][0]["group_id"]
    state["batch_shortfall"] = {1: -1}
    path = tmp_path / "bad"
    path.write_bytes(encode_sidecar(state, format=fmt, validate=False))  # type: ignore[arg-type]
    result = run("validate", str(path))
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    paths = [line.split(": ", 1)[0] for line in lines]
    assert "$.batch_shortfall[1]" in paths
    assert "$.groups[1].siblings[2].attempts[1].status" in paths
    assert "$.groups[2].siblings[0].attempts[0].staging_keys" in paths
    assert any(p.startswith("$.groups[3]") for p in paths)
    assert len(lines) == len(set(lines)) >= 4
    # After the problems, on stderr: how many, and which lineage they were read as.
    assert f"invalid {fmt} sidecar, {len(lines)} problems; read as lineage uuid" in result.stderr


def test_validate_native_type_error_still_lists_everything(tmp_path: Path) -> None:
    state = copy.deepcopy(STATE)
    state["groups"][0]["expected_generations"] = "four"  # the typed decoder stops here
    state["groups"][2]["phase"] = "nowhere"
    path = tmp_path / "bad"
    path.write_bytes(encode_sidecar(state, validate=False))
    result = run("validate", str(path))
    assert result.exit_code == 1, result.output
    paths = [line.split(": ", 1)[0] for line in result.stdout.splitlines()]
    assert paths == ["$.groups[0].expected_generations", "$.groups[2].phase"]


@pytest.mark.parametrize("command", ["validate", "inspect"])
def test_unreadable_input_exits_2(tmp_path: Path, command: str) -> None:
    missing = run(command, str(tmp_path / "missing"))
    assert missing.exit_code == 2
    junk = tmp_path / "junk"
    junk.write_bytes(b"not a sidecar")
    assert run(command, str(junk)).exit_code == 2
    truncated = tmp_path / "truncated"
    truncated.write_bytes(encode_sidecar(STATE)[:-10])
    assert run(command, str(truncated)).exit_code == 2
    assert run(command, str(tmp_path)).exit_code == 2  # a directory with no sidecar


def test_inspect_invalid_exits_1(tmp_path: Path) -> None:
    state = copy.deepcopy(STATE)
    state["groups"][0]["status"] = "ready_to_finalize"
    path = tmp_path / "bad"
    path.write_bytes(encode_sidecar(state, validate=False))
    result = run("inspect", str(path))
    assert result.exit_code == 1
    assert "$.groups[0].status" in result.output


@pytest.mark.parametrize(("source", "target"), [("native", "pt"), ("pt", "native")])
def test_convert_is_lossless_both_ways(tmp_path: Path, source: str, target: str) -> None:
    src = tmp_path / "src"
    write_sidecar(src, STATE, format=source)  # type: ignore[arg-type]
    middle, back = tmp_path / "middle", tmp_path / "back"
    result = run("convert", str(src), str(middle), "--to", target)
    assert result.exit_code == 0, result.output
    assert run("convert", str(middle), str(back), "--to", source).exit_code == 0
    assert read_sidecar(middle) == read_sidecar(back) == STATE
    # Same format again gives the same bytes: both writers are deterministic.
    assert back.read_bytes() == src.read_bytes()
    assert run("inspect", "--json", str(middle)).exit_code == 0


def test_convert_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    write_sidecar(src, STATE)
    dst.write_bytes(b"keep me")
    assert run("convert", str(src), str(dst), "--to", "pt").exit_code == 1
    assert dst.read_bytes() == b"keep me"
    assert run("convert", str(src), str(dst), "--to", "pt", "--force").exit_code == 0
    assert read_sidecar(dst) == STATE


def test_convert_into_a_directory_uses_the_conventional_name(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_sidecar(src, STATE)
    out = tmp_path / "ckpt"
    out.mkdir()
    assert run("convert", str(src), str(out), "--to", "pt").exit_code == 0
    assert read_sidecar(out / "rollout_recovery.pt") == STATE


def test_convert_invalid_source(tmp_path: Path) -> None:
    assert run("convert", str(tmp_path / "nope"), str(tmp_path / "d"), "--to", "pt").exit_code == 2
    assert not (tmp_path / "d").exists()


def test_validate_reports_a_fault_only_the_typed_decoder_sees(tmp_path: Path) -> None:
    state = copy.deepcopy(STATE)
    state["groups"][1]["target_step"] = True  # the seed's isinstance check lets a bool pass
    state["groups"][2]["phase"] = "nowhere"
    path = tmp_path / "bad"
    path.write_bytes(encode_sidecar(state, validate=False))
    result = run("validate", str(path))
    assert result.exit_code == 1, result.output
    paths = {line.split(": ", 1)[0] for line in result.stdout.splitlines()}
    assert paths == {"$.groups[1].target_step", "$.groups[2].phase"}


def test_convert_keeps_an_int_reward_exactly(tmp_path: Path) -> None:
    """The loader normalizes rewards to floats; a conversion must not (found by review)."""
    from rollout_recovery.checkpoint._sidecar_io import decode_sidecar, encode_sidecar
    from rollout_recovery.ledger import RolloutRecoveryLedger, build_rollout_recovery_state

    class _Cut:
        def require_live(self) -> None:
            return None

    ledger = RolloutRecoveryLedger()
    ledger.reserve_group(
        _Cut(),
        prompt_id="1",
        prompt_payload={"idx": 1},
        expected_generations=2,
        target_step=0,
        start_weight_version=0,
        group_id="g",
    )
    ledger.mark_group_dispatched(_Cut(), "g")
    gate = ledger.get_group("g").gate_rollout_id(0)
    ledger.mark_sibling_sealed(
        _Cut(),
        "g",
        generation_index=0,
        gate_rollout_id=gate,
        receipt=None,
        reward=1.0,
        mask_sample=False,
    )
    state = copy.deepcopy(
        build_rollout_recovery_state(ledger, batch_shortfall={}, sampler_stamps_target_steps=True)
    )
    state["groups"][0]["siblings"][0]["attempts"][0]["reward"] = 1  # an int, as the seed allows
    source = tmp_path / "s.native"
    source.write_bytes(encode_sidecar(state, format="native"))
    result = CliRunner().invoke(
        cli, ["convert", str(source), str(tmp_path / "out.pt"), "--to", "pt"]
    )
    assert result.exit_code == 0, result.output
    _, written = decode_sidecar((tmp_path / "out.pt").read_bytes())
    assert type(written["groups"][0]["siblings"][0]["attempts"][0]["reward"]) is int


def _sealed_state(reward: float) -> dict[str, Any]:
    from rollout_recovery.ledger import RolloutRecoveryLedger, build_rollout_recovery_state

    class _Cut:
        def require_live(self) -> None:
            return None

    ledger = RolloutRecoveryLedger()
    ledger.reserve_group(
        _Cut(),
        prompt_id="1",
        prompt_payload={"idx": 1},
        expected_generations=2,
        target_step=0,
        start_weight_version=0,
        group_id="g",
    )
    ledger.mark_group_dispatched(_Cut(), "g")
    gate = ledger.get_group("g").gate_rollout_id(0)
    ledger.mark_sibling_sealed(
        _Cut(),
        "g",
        generation_index=0,
        gate_rollout_id=gate,
        receipt=None,
        reward=reward,
        mask_sample=False,
    )
    return build_rollout_recovery_state(
        ledger,
        batch_shortfall={},
        sampler_stamps_target_steps=True,
        finalizer_metrics_by_group={"done": {"m": float("nan")}},
    )


@pytest.mark.parametrize(("source_format", "target"), [("native", "pt"), ("pt", "native")])
def test_convert_keeps_a_nan_and_succeeds(tmp_path: Path, source_format: str, target: str) -> None:
    import math

    from rollout_recovery.checkpoint._sidecar_io import decode_sidecar, encode_sidecar

    source = tmp_path / "source"
    source.write_bytes(encode_sidecar(_sealed_state(float("nan")), format=source_format))  # type: ignore[arg-type]
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["convert", str(source), str(out), "--to", target])
    assert result.exit_code == 0, result.output
    _, written = decode_sidecar(out.read_bytes())
    assert math.isnan(written["groups"][0]["siblings"][0]["attempts"][0]["reward"])
    assert math.isnan(written["finalizer_metrics_by_group"]["done"]["m"])


def test_a_failed_convert_leaves_no_destination(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rollout_recovery.checkpoint._sidecar_io import encode_sidecar
    from rollout_recovery.cli import _convert

    source = tmp_path / "source"
    source.write_bytes(encode_sidecar(_sealed_state(1.0), format="native"))
    monkeypatch.setattr(_convert, "same_state", lambda left, right: False)
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["convert", str(source), str(out), "--to", "pt"])
    assert result.exit_code == 1
    assert "would not read back unchanged" in result.output
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["source"]
