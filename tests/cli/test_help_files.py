"""What the commands' help says a run directory holds is what the run directory names.

``run --help`` once listed ``trained_rows.jsonl`` long after no run wrote it (issue 24,
item 22). Every file a command's help names must be one ``RunDirectory`` lays out (the
one place that names a run's files).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from rollout_recovery.cli._main import cli
from rollout_recovery.rundir import RunDirectory

#: A file name as help text writes it: ``events.jsonl``, ``reward.png``.
FILE_NAME = re.compile(r"\b[\w.-]+\.(?:jsonl|json|png|sqlite|toml|msgpack|npz)\b")


#: Files a command's help names that are not a run directory's: ``export`` writes a
#: Hugging Face model directory (its ``config.json``) somewhere else.
NOT_IN_A_RUN = {"export": {"config.json"}}


def _laid_out() -> set[str]:
    run = RunDirectory(Path("run"))
    paths = (getattr(run, name) for name in dir(RunDirectory) if not name.startswith("_"))
    return {path.name for path in paths if isinstance(path, Path)}


@pytest.mark.parametrize("command", sorted(cli.commands))
def test_every_file_a_commands_help_names_is_one_a_run_directory_holds(command: str) -> None:
    result = CliRunner().invoke(cli, [command, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    named = set(FILE_NAME.findall(result.output)) - NOT_IN_A_RUN.get(command, set())
    assert named <= _laid_out(), (
        f"`rollout-recovery {command} --help` names {sorted(named - _laid_out())}, which no "
        "run directory holds (rundir/_layout.py names every file of a run)"
    )


def test_run_help_names_the_journal() -> None:
    result = CliRunner().invoke(cli, ["run", "--help"], terminal_width=200)
    assert "events.jsonl" in result.output
