"""A job whose components cannot be built claims nothing: the directory is left as it was
found (only the lock file names the refused process), so the corrected job starts there
(issue 24, item 20).

``job.toml``, ``events.jsonl`` and the data plane used to be written before the trainer
was built, so after a model that does not load the corrected config was refused as
"another job". The directory is now claimed (``job.toml`` written) only once the
components are built; what the start made before is removed if it stops.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rollout_recovery.control import RunConfig
from rollout_recovery.errors import ConfigError
from rollout_recovery.history import audit_run
from rollout_recovery.job import run_job
from rollout_recovery.job._components import default_components

MakeConfig = Callable[..., RunConfig]


def _unbuildable(config: RunConfig, data_plane: Any) -> Any:
    default_components(config, data_plane)  # everything before it is opened for real
    raise ConfigError("the model cannot be built", path="$.model.source")


@pytest.mark.parametrize("existing", [False, True], ids=["new-path", "empty-directory"])
def test_a_job_that_cannot_be_built_leaves_the_directory_as_it_found_it(
    tmp_path: Path, fast_config: MakeConfig, existing: bool
) -> None:
    out = tmp_path / "run"
    if existing:
        out.mkdir(mode=0o755)
        os.chmod(out, 0o755)
    config = fast_config({"job": {"steps": 2}})

    with pytest.raises(ConfigError, match="cannot be built"):
        run_job(out, config, components=_unbuildable)

    assert sorted(os.listdir(out)) == [".lock"]
    if existing:
        assert out.stat().st_mode & 0o777 == 0o755

    # The corrected job (here: the default components) starts in the same directory.
    result = run_job(out, config)
    assert result.restored is None and result.summary.steps == 2
    assert (out / "job.toml").is_file()
    assert audit_run(out).ok


def test_another_seed_after_a_job_that_could_not_be_built_is_not_another_job(
    tmp_path: Path, fast_config: MakeConfig
) -> None:
    """What the refused start asked for is not recorded: a changed identity field is the
    user's correction, not a mismatch."""
    out = tmp_path / "run"
    with pytest.raises(ConfigError):
        run_job(out, fast_config({"job": {"steps": 2, "seed": 1}}), components=_unbuildable)
    result = run_job(out, fast_config({"job": {"steps": 2, "seed": 2}}))
    assert result.summary.steps == 2
