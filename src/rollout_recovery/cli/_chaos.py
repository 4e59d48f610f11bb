"""``rollout-recovery chaos``: kill the main job K times, rerun it to the end, audit it."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from ..chaos import ChaosReport, run_chaos
from ..errors import ConfigError

__all__ = ["chaos", "render_chaos_report"]


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
        render_chaos_report(report, Console(soft_wrap=True))
    sys.exit(0 if report.ok else 1)


def render_chaos_report(report: ChaosReport, console: Console) -> None:
    """The report as two tables (kills per point, the numbers) and the audit's verdict."""
    data = report.to_json()
    points = Table(title="kills per point", header_style="bold")
    points.add_column("point")
    points.add_column("killed and survived", justify="right")
    points.add_column("not reached", justify="right")
    for label in sorted(set(report.kills_by_point) | set(report.not_reached_by_point)):
        points.add_row(
            label,
            str(report.kills_by_point.get(label, 0)),
            str(report.not_reached_by_point.get(label, 0)),
        )
    console.print(points)

    tokens = data["tokens"]
    stall = report.longest_checkpoint_stall_s
    numbers = Table(title="chaos report", header_style="bold")
    numbers.add_column("metric")
    numbers.add_column("value", justify="right")
    for name, value in (
        ("kills (verified / planned)", f"{report.kills} / {len(report.schedule)}"),
        ("runs started", str(report.runs)),
        ("reruns after the last kill", str(report.final_reruns)),
        ("restores", str(report.restores)),
        ("sealed siblings reused", str(report.sealed_reused)),
        ("sealed siblings regenerated", str(report.sealed_regenerated)),
        ("sealed tokens reused", str(tokens["reused"])),
        ("tokens wasted per kill, mean", f"{tokens['wasted_per_kill_mean']:.1f}"),
        ("tokens wasted per kill, max", str(tokens["wasted_per_kill_max"])),
        ("tokens unsealed at the kill, mean", f"{tokens['unsealed_per_kill_mean']:.1f}"),
        ("tokens unsealed at the kill, max", str(tokens["unsealed_per_kill_max"])),
        ("kills wasting more than the unsealed", str(tokens["kills_wasting_more_than_unsealed"])),
        ("journal records replayed", str(report.replayed_records)),
        ("torn journal tails cut", str(report.torn_tails_cut)),
        (
            "  of which prompt-group cohorts (never resumed)",
            _mean_max(tokens["cohort_in_flight_regenerated_per_kill"]),
        ),
        ("staged tokens kept to resume per kill", _mean_max(tokens["resumable_per_kill"])),
        (
            "longest checkpoint stall",
            "n/a" if stall is None else f"{stall:.3f} s ({report.stall_source})",
        ),
        ("wall time", f"{report.wall_time_s:.1f} s"),
        ("run directory", str(report.out)),
    ):
        numbers.add_row(name, value)
    console.print(numbers)

    for failure in report.failures:
        console.print(f"failure: {failure}", markup=False, highlight=False)
    audit = report.audit
    if audit is None:
        console.print("audit: not run", markup=False)
        return
    counts = ", ".join(f"{name}={value}" for name, value in audit.counts.items())
    verdict = "PASS" if audit.ok else f"FAIL ({audit.violation_count} violations)"
    console.print(f"audit: {verdict}; {counts}", markup=False, highlight=False)
    for violation in audit.first_violations:
        console.print(f"  {violation}", markup=False, highlight=False)


def _mean_max(values: dict[str, float]) -> str:
    return f"{values['mean']:.1f} / {values['max']:.0f}"
