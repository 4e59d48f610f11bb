"""Every integer of the config is bounded by what a checkpoint can hold, and checked before
anything is written (issue 15, item 4).

``--seed 18446744073709551616`` used to pass validation, claim the run directory, and
then every checkpoint died with ``OverflowError``. Now every int field refuses a value
past the 64-bit range with its path, the command line exits 2 without creating the
directory, and the largest value that validates runs and checkpoints.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import msgspec.inspect as mi
import pytest
from click.testing import CliRunner
from run_fixtures import run_config_fields

from rollout_recovery._bounds import INT64_MAX
from rollout_recovery.cli._main import cli
from rollout_recovery.control import RunConfig, load_config
from rollout_recovery.errors import ConfigError
from rollout_recovery.job import run_job


def _int_fields() -> list[tuple[str, str]]:
    return [(s, f) for s, f, kind in run_config_fields() if isinstance(kind, mi.IntType)]


INT_FIELDS = _int_fields()


def test_the_config_has_int_fields_to_check() -> None:
    assert ("job", "seed") in INT_FIELDS and len(INT_FIELDS) >= 10


@pytest.mark.parametrize("value", [INT64_MAX + 1, 2**64, 2**200])
@pytest.mark.parametrize(("section", "field"), INT_FIELDS, ids=[f"{s}.{f}" for s, f in INT_FIELDS])
def test_every_int_field_refuses_a_value_past_64_bits_naming_it(
    tmp_path: Path, section: str, field: str, value: int
) -> None:
    path = tmp_path / "job.toml"
    path.write_text(f"[{section}]\n{field} = {value}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.path == f"$.{section}.{field}"
    # Its own bound, or the 64-bit one: never above what a checkpoint holds.
    bound = re.fullmatch(r".*Expected `int` <= (\d+)", str(caught.value))
    assert bound is not None, str(caught.value)
    assert int(bound[1]) <= INT64_MAX


@pytest.mark.parametrize("seed", [str(2**64), str(INT64_MAX + 1)])
def test_a_seed_past_64_bits_on_the_command_line_is_refused_before_anything_is_written(
    tmp_path: Path, seed: str
) -> None:
    out = tmp_path / "run"
    result = CliRunner().invoke(cli, ["run", "--out", str(out), "--seed", seed, "--plain"])
    assert result.exit_code == 2, result.output
    assert f"$.job.seed: Expected `int` <= {INT64_MAX}" in result.output
    assert "Traceback" not in result.output
    assert not out.exists()


def test_the_largest_seed_that_validates_runs_checkpoints_and_resumes(
    tmp_path: Path, fast_config: Callable[..., RunConfig]
) -> None:
    out = tmp_path / "run"
    first = run_job(out, fast_config({"job": {"steps": 2, "seed": INT64_MAX}}))
    assert first.summary.steps == 2 and first.summary.checkpoints >= 2
    resumed = run_job(out, fast_config({"job": {"steps": 3, "seed": INT64_MAX}}))
    assert resumed.restored is not None and resumed.summary.steps == 3
