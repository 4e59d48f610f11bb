"""``rollout-recovery chaos``: kill the main job K times, rerun it to the end, audit it."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import click
from rich.console import Console

from ..chaos import run_chaos
from ..errors import ConfigError

__all__ = ["chaos"]


@click.command("chaos")
@click.option(
    "--kills",
    type=click.IntRange(min=0),
    required=True,
    help="How many times to kill the job before letting it finish.",
)
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Seeds the kill schedule (same seed and config, same schedule); also the job's seed.",
)
@click.option(
    "--out",
    "out",
    type=click.Path(file_okay=False, path_type=Path),
    help="Run directory, new or empty (default: a new temporary directory, printed).",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="TOML job configuration, as for `rollout-recovery run`.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def chaos(kills: int, seed: int, out: Path | None, config_path: Path | None, as_json: bool) -> None:
    """Kill `rollout-recovery run` K times, rerun it until it finishes, and audit it.

    Each kill is either a SIGKILL of the job's process group after a random number of
    output lines, or a named crash point inside the code (in a checkpoint write, between
    a put and a discard, mid-restore, ...) armed through the environment. Progress goes
    to stderr; the report to stdout. Exit 0 only when every kill was verified, the run
    finished and the audit passed; 1 otherwise.
    """
    if out is None:
        out = Path(tempfile.mkdtemp(prefix="rollout-recovery-chaos-"))
        click.echo(f"run directory: {out}", err=True)

    def log(message: str) -> None:
        click.echo(message, err=True)

    try:
        report = run_chaos(kills=kills, seed=seed, out=out, config_path=config_path, log=log)
    except ConfigError as error:
        raise click.UsageError(str(error)) from None
    except ValueError as error:
        raise click.UsageError(str(error)) from None
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        report.render(Console(soft_wrap=True))
    sys.exit(0 if report.ok else 1)
