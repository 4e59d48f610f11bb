"""The chaos report as a person reads it: two tables and the audit's verdict."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:  # _chaos imports this module for ChaosReport.render
    from ._chaos import ChaosReport

__all__ = ["render_chaos_report"]


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
