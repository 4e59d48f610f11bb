"""``inspect``, ``validate`` and ``convert`` on both lineages, each naming the one it read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from make_golden_gym import DATA, GOLDEN_NATIVE, GOLDEN_PT, gym_sidecar
from sidecar_fixtures import rich_state

from rollout_recovery.checkpoint import SidecarFormat, write_sidecar
from rollout_recovery.checkpoint._sidecar_io import encode_sidecar
from rollout_recovery.cli._main import cli

GYM_GOLDENS = (GOLDEN_PT, GOLDEN_NATIVE)
MIXED = "$.groups[3].siblings[0].attempts[1].attempt_index"


def run(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args))


@pytest.fixture(params=["pt", "native"])
def ours(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    path = tmp_path / f"ours-{request.param}.bin"
    write_sidecar(path, rich_state(), format=request.param)
    return path


@pytest.mark.parametrize("name", GYM_GOLDENS)
def test_inspect_names_the_gym_lineage_and_what_only_it_holds(name: str) -> None:
    result = run("inspect", str(DATA / name))
    assert result.exit_code == 0, result.output
    assert (
        "lineage                 gym: attempts named by attempt_index, gate ids <logical> for "
        "attempt 0, <logical>-a<N> after"
    ) in result.output
    assert "pending acks            2" in result.output
    assert "highest attempt index   2" in result.output
    assert "reward settings" not in result.output  # a field only the uuid lineage has
    summary = json.loads(run("inspect", "--json", str(DATA / name)).output)
    assert summary["lineage"]["name"] == "gym"
    assert summary["gym"]["completion_receipts"] == 5


def test_inspect_names_our_lineage(ours: Path) -> None:
    result = run("inspect", str(ours))
    assert result.exit_code == 0, result.output
    assert "gym" not in result.output
    assert "lineage                 uuid: attempts named by attempt_uuid" in result.output
    summary = json.loads(run("inspect", "--json", str(ours)).output)
    assert summary["lineage"] == {
        "name": "uuid",
        "attempt_identity": "attempt_uuid",
        "capture_keys": "<logical>_a<attempt_uuid hex>",
    }


@pytest.mark.parametrize("name", GYM_GOLDENS)
def test_validate_passes_a_gym_sidecar_by_its_own_rules(name: str) -> None:
    result = run("validate", str(DATA / name))
    assert result.exit_code == 0, result.output
    assert "valid" in result.stdout and "sidecar of lineage gym (" in result.stdout
    assert "attempt_index" in result.stdout


def test_validate_names_our_lineage(ours: Path) -> None:
    result = run("validate", str(ours))
    assert result.exit_code == 0, result.output
    assert "sidecar of lineage uuid (" in result.stdout


@pytest.mark.parametrize("fmt", ["pt", "native"])
def test_validate_lists_a_mixed_attempt_and_names_the_lineage_it_read(
    tmp_path: Path, fmt: str
) -> None:
    state = gym_sidecar()
    del state["groups"][3]["siblings"][0]["attempts"][1]["attempt_index"]
    state["groups"][0]["siblings"][2]["attempts"][1]["attempt_index"] = 7
    path = tmp_path / "mixed"
    path.write_bytes(encode_sidecar(state, format=fmt, validate=False))
    result = run("validate", str(path))
    assert result.exit_code == 1, result.output
    assert [line.split(": ", 1)[0] for line in result.stdout.splitlines()] == [
        "$.groups[0].siblings[2].attempts[1].attempt_index",
        MIXED,
    ]
    assert f"invalid {fmt} sidecar, 2 problems; read as lineage gym (" in result.stderr


def test_validate_of_a_native_uuid_file_with_a_gym_attempt(tmp_path: Path) -> None:
    state = rich_state()
    state["groups"][3]["siblings"][0]["attempts"][1]["attempt_index"] = 1
    path = tmp_path / "mixed"
    path.write_bytes(encode_sidecar(state, validate=False))
    result = run("validate", str(path))
    assert result.exit_code == 1, result.output
    assert [line.split(": ", 1)[0] for line in result.stdout.splitlines()] == [MIXED]
    assert "read as lineage uuid (" in result.stderr


def test_inspect_refuses_a_mixed_gym_file_naming_the_attempt(tmp_path: Path) -> None:
    state = gym_sidecar()
    del state["groups"][3]["siblings"][0]["attempts"][1]["attempt_index"]
    path = tmp_path / "mixed.pt"
    path.write_bytes(encode_sidecar(state, format="pt", validate=False))
    result = run("inspect", str(path))
    assert result.exit_code == 1
    assert f"{MIXED}: missing attempt_index" in result.output


@pytest.mark.parametrize(("source", "target"), [(GOLDEN_PT, "native"), (GOLDEN_NATIVE, "pt")])
def test_convert_keeps_the_gym_lineage_and_every_value(
    tmp_path: Path, source: str, target: str
) -> None:
    out = tmp_path / "out"
    result = run("convert", str(DATA / source), str(out), "--to", target, "--lineage", "gym")
    assert result.exit_code == 0, result.output
    assert "lineage gym kept (attempt_index)" in result.output
    written_format, written = SidecarFormat.decode(out.read_bytes())
    assert written_format == target
    assert written == gym_sidecar()
    assert SidecarFormat.lineage(written) == "gym"
    back = tmp_path / "back"
    assert (
        run("convert", str(out), str(back), "--to", "native" if target == "pt" else "pt").exit_code
        == 0
    )
    assert SidecarFormat.decode(back.read_bytes())[1] == gym_sidecar()


def test_convert_keeps_our_lineage(ours: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = run("convert", str(ours), str(out), "--to", "pt", "--lineage", "uuid")
    assert result.exit_code == 0, result.output
    assert "lineage uuid kept (attempt_uuid)" in result.output


@pytest.mark.parametrize("source", ["gym", "uuid"])
def test_convert_never_crosses_lineages(tmp_path: Path, source: str) -> None:
    if source == "gym":
        src, other = DATA / GOLDEN_PT, "uuid"
    else:
        src, other = tmp_path / "ours.pt", "gym"
        write_sidecar(src, rich_state(), format="pt")
    out = tmp_path / "out"
    result = run("convert", str(src), str(out), "--to", "native", "--lineage", other)
    assert result.exit_code == 1
    assert f"holds lineage {source} (" in result.output
    assert f"not {other}: a conversion never changes a sidecar's lineage" in result.output
    assert not out.exists()
