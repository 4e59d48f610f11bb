"""A Gym-lineage sidecar in a run's checkpoint is never taken for this run's.

The newest checkpoint of a finished run gets the Gym-lineage golden as its sidecar, with
its ``COMMITTED`` manifest rewritten to vouch for it (so only the lineage is wrong). The
audit reports that checkpoint unusable, naming the lineage, and counts the lineage of the
sidecars it did read; a restore skips it for the previous checkpoint, the rerun retrains
the step from there, and the audit passes again.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from click.testing import CliRunner
from make_golden_gym import DATA, GOLDEN_PT

from rollout_recovery.checkpoint._sidecar_io import PT_SIDECAR_FILENAME, SIDECAR_FILENAMES
from rollout_recovery.cli._main import cli
from rollout_recovery.control import RunConfig
from rollout_recovery.history import audit_run
from rollout_recovery.job import run_job


def _plant_gym_sidecar(checkpoint: Path) -> None:
    manifest_path = checkpoint / "COMMITTED"
    manifest = json.loads(manifest_path.read_text())
    for name in SIDECAR_FILENAMES:
        if (checkpoint / name).exists():
            (checkpoint / name).unlink()
            del manifest["files"][name]
    data = (DATA / GOLDEN_PT).read_bytes()
    (checkpoint / PT_SIDECAR_FILENAME).write_bytes(data)
    manifest["files"][PT_SIDECAR_FILENAME] = {
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    manifest_path.write_text(json.dumps(manifest, sort_keys=True, indent=1) + "\n")


def test_the_audit_and_a_restore_refuse_a_gym_lineage_checkpoint(
    finished_run: tuple[Path, RunConfig],
) -> None:
    out, config = finished_run
    report = audit_run(out)
    assert report.ok, report.violations
    assert report.counts["sidecar_lineage"] == "uuid"

    _plant_gym_sidecar(out / "checkpoints" / "step_000010")
    report = audit_run(out)
    assert not report.ok
    [violation] = [v for v in report.violations if "step_000010 is published" in v]
    assert "is published but unusable" in violation
    assert "is NeMo-RL's Gym lineage (attempts named by attempt_index" in violation
    assert report.counts["sidecar_lineage"] == "uuid"  # the checkpoints it could read
    printed = CliRunner().invoke(cli, ["audit", str(out)])
    assert printed.exit_code == 1
    assert "step_000010 is published but unusable" in printed.output
    assert "Gym lineage" in printed.output
    assert "sidecar_lineage" in printed.output

    messages: list[str] = []
    result = run_job(out, config, log=messages.append)
    assert [(skip.name, skip.step) for skip in result.skipped] == [("step_000010", 10)]
    assert "Gym lineage" in result.skipped[0].reason
    report = audit_run(out)
    assert report.ok, report.violations
    assert report.counts["sidecar_lineage"] == "uuid"
    printed = CliRunner().invoke(cli, ["audit", "--json", str(out)])
    assert printed.exit_code == 0
    assert json.loads(printed.output)["counts"]["sidecar_lineage"] == "uuid"
