"""``rollout-recovery inspect PATH``: what a sidecar holds, for people (or ``--json``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..checkpoint import load_sidecar
from ._sidecar_errors import exit_on_bad_sidecar

__all__ = ["inspect"]


def _json_ready(value: Any) -> Any:
    """``value`` with every float that is not finite (NaN, ±inf) replaced by ``None``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _json_ready(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_ready(item) for item in value]
    return value


def _mapping(counts: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value}" for key, value in counts.items()) or "-"


def _rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    groups, siblings, staging = summary["groups"], summary["siblings"], summary["staging_keys"]
    header = f"{summary['format']}, {summary['size_bytes']} bytes"
    if summary["format_version"] is not None:
        header += (
            f", format v{summary['format_version']}, writer {summary['writer_version']}, "
            f"{summary['payload_checksum']}"
        )
    lineage = summary["lineage"]
    rows = [
        ("file", summary["path"]),
        ("format", header),
        (
            "lineage",
            f"{lineage['name']}: attempts named by {lineage['attempt_identity']}, gate ids "
            f"{lineage['capture_keys']}",
        ),
        ("schema version", str(summary["schema_version"])),
        ("groups", str(groups["total"])),
        ("  by status", _mapping(groups["by_status"])),
        ("  by phase", _mapping(groups["by_phase"])),
        ("  by granularity", _mapping(groups["by_granularity"])),
        ("siblings", f"{siblings['total']} ({siblings['sealed']} sealed)"),
        ("  current attempt", _mapping(siblings["current_attempts_by_status"])),
        ("  attempts per sibling", _mapping(siblings["attempts_per_sibling"])),
        ("  attempts total", str(siblings["attempts_total"])),
        (
            "staging keys",
            f"{staging['expected']} expected "
            f"({staging['sealed_without_receipt']} sealed siblings without receipt)",
        ),
        ("shortfall by step", _mapping(summary["shortfall_by_step"])),
        ("sampler stamps steps", str(summary["sampler_stamps_target_steps"])),
    ]
    if "gym" in summary:  # what only the Gym lineage holds
        gym = summary["gym"]
        rows += [
            ("resolved agents", _mapping(gym["resolved_agents"])),
            ("completion receipts", f"{gym['completion_receipts']} on current attempts"),
            ("pending acks", str(gym["pending_acknowledgements"])),
            ("highest attempt index", str(gym["highest_attempt_index"])),
        ]
        return rows
    finalizer = summary["finalizer"]
    rows += [
        (
            "reward settings",
            "off"
            if summary["reward_settings"] is None
            else json.dumps(summary["reward_settings"], sort_keys=True),
        ),
        (
            "finalizer",
            f"{finalizer['groups']} groups, {finalizer['reward_observations']} reward rows",
        ),
    ]
    for name, stats in finalizer["metrics"].items():
        rows.append(
            (
                f"  {name}",
                f"mean={stats['mean']:.6g} min={stats['min']:.6g} max={stats['max']:.6g} "
                f"over {stats['groups']} groups",
            )
        )
    return rows


@click.command("inspect")
@click.argument("path", type=click.Path(path_type=Path))
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help=(
        "Print the summary as one standard JSON document; a number that is not finite "
        "(NaN, Infinity) is written as null."
    ),
)
def inspect(path: Path, as_json: bool) -> None:
    """Summarize a sidecar file or a checkpoint directory's sidecar.

    The file is fully validated first (exit 1 if invalid, 2 if unreadable); its format and
    its lineage (uuid: attempt_uuid, this package's; gym: NeMo-RL's attempt_index line) are
    detected from content and reported. Rich tables on a terminal, plain ``key: value``
    lines otherwise.
    With --json, one standard JSON document (RFC 8259) in which a number that is not
    finite, such as the mean of a NaN metric, is null.
    """
    with exit_on_bad_sidecar(path):
        summary = load_sidecar(path).summary()
    if as_json:
        # allow_nan=False: should a non-finite number ever slip past _json_ready, fail
        # rather than print NaN or Infinity, which no strict JSON parser accepts.
        click.echo(json.dumps(_json_ready(summary), indent=2, sort_keys=True, allow_nan=False))
        return
    console = Console()
    if console.is_terminal:
        table = Table(title="rollout-recovery sidecar", box=box.SIMPLE_HEAD, show_header=False)
        table.add_column(style="bold cyan")
        table.add_column(overflow="fold")
        for key, value in _rows(summary):
            # Text, not str: a value such as a JSON list must not be read as rich markup.
            table.add_row(key, Text(value))
        console.print(table)
        return
    width = max(len(key) for key, _ in _rows(summary))
    for key, value in _rows(summary):
        click.echo(f"{key.ljust(width)}  {value}")
