"""``rollout-recovery inspect PATH``: what a sidecar holds, for people (or ``--json``)."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..checkpoint import LoadedSidecar
from ._sidecar_errors import load_or_exit

__all__ = ["inspect", "summarize_sidecar"]


def _counts(values: list[Any]) -> dict[str, int]:
    return {str(key): count for key, count in sorted(Counter(values).items(), key=repr)}


def _mean(values: list[float]) -> float:
    """The mean without overflow: ``[1e308, 1e308]`` gives 1e308, not inf.

    The sum is exact (``math.fsum``, or fractions where it passes the float range), so the
    mean is within an ulp. NaN when a value is NaN, ±inf when the infinities agree.
    """
    if not all(map(math.isfinite, values)):
        return sum(values) / len(values)
    try:
        return math.fsum(values) / len(values)
    except OverflowError:
        # A sum beyond the float range; the mean of finite floats never is. Exact, then.
        return float(sum(map(Fraction, values), Fraction(0)) / len(values))


def _extreme(values: list[float], pick: Callable[[list[float]], float]) -> float:
    # min/max with a NaN depend on where the NaN is; make any NaN the answer instead.
    return math.nan if any(map(math.isnan, values)) else float(pick(values))


def _json_ready(value: Any) -> Any:
    """``value`` with every float that is not finite (NaN, ±inf) replaced by ``None``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _json_ready(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_ready(item) for item in value]
    return value


def summarize_sidecar(loaded: LoadedSidecar) -> dict[str, Any]:
    """A JSON-ready summary of a validated sidecar (the ``--json`` document).

    Standard JSON: a number that is not finite (a NaN metric, or a mean of infinities) is
    ``None``.
    """
    summary: dict[str, Any] = _json_ready(_summary(loaded))
    return summary


def _summary(loaded: LoadedSidecar) -> dict[str, Any]:
    """The summary with its floats as computed (NaN and ±inf kept, for the text view)."""
    parsed = loaded.parsed
    groups: list[dict[str, Any]] = parsed.ledger_state["groups"]
    siblings = [sibling for group in groups for sibling in group["siblings"]]
    currents = [sibling["attempts"][-1] for sibling in siblings]
    metrics: dict[str, list[float]] = {}
    for values in parsed.finalizer_metrics_by_group.values():
        for name, number in values.items():
            metrics.setdefault(name, []).append(number)
    return {
        "path": str(loaded.path),
        "format": loaded.format,
        "size_bytes": loaded.size,
        "format_version": loaded.format_version,
        "writer_version": loaded.writer_version,
        "payload_checksum": loaded.payload_checksum,
        "schema_version": parsed.ledger_state["schema_version"],
        "groups": {
            "total": len(groups),
            "by_status": _counts([group["status"] for group in groups]),
            "by_phase": _counts([group["phase"] for group in groups]),
            "by_granularity": _counts([group["recovery_granularity"] for group in groups]),
        },
        "siblings": {
            "total": len(siblings),
            "sealed": sum(attempt["status"] == "sealed" for attempt in currents),
            "current_attempts_by_status": _counts([attempt["status"] for attempt in currents]),
            "attempts_per_sibling": _counts([len(sibling["attempts"]) for sibling in siblings]),
            "attempts_total": sum(len(sibling["attempts"]) for sibling in siblings),
        },
        "staging_keys": {
            # What a restore keeps in the staging partition: keys of sealed current attempts.
            "expected": len(loaded.ledger.expected_staging_keys()),
            "sealed_without_receipt": sum(
                attempt["status"] == "sealed" and attempt["receipt"] is None for attempt in currents
            ),
        },
        "shortfall_by_step": {
            str(step): count for step, count in sorted(parsed.batch_shortfall.items())
        },
        "sampler_stamps_target_steps": parsed.sampler_stamps_target_steps,
        "reward_settings": (
            None if parsed.reward_settings is None else parsed.reward_settings.to_state()
        ),
        "finalizer": {
            "groups": len(parsed.finalizer_metrics_by_group),
            "reward_observations": sum(
                len(rows) for rows in parsed.finalizer_rewards_by_group.values()
            ),
            "metrics": {
                name: {
                    "groups": len(values),
                    "mean": _mean(values),
                    "min": _extreme(values, min),
                    "max": _extreme(values, max),
                }
                for name, values in sorted(metrics.items())
            },
        },
    }


def _mapping(counts: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value}" for key, value in counts.items()) or "-"


def _rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    groups, siblings, staging = summary["groups"], summary["siblings"], summary["staging_keys"]
    finalizer = summary["finalizer"]
    header = f"{summary['format']}, {summary['size_bytes']} bytes"
    if summary["format_version"] is not None:
        header += (
            f", format v{summary['format_version']}, writer {summary['writer_version']}, "
            f"{summary['payload_checksum']}"
        )
    rows = [
        ("file", summary["path"]),
        ("format", header),
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

    The file is fully validated first (exit 1 if invalid, 2 if unreadable); its format is
    detected from content. Rich tables on a terminal, plain ``key: value`` lines otherwise.
    With --json, one standard JSON document (RFC 8259) in which a number that is not
    finite, such as the mean of a NaN metric, is null.
    """
    loaded = load_or_exit(path)
    if as_json:
        # allow_nan=False: should a non-finite number ever slip past _json_ready, fail
        # rather than print NaN or Infinity, which no strict JSON parser accepts.
        click.echo(json.dumps(summarize_sidecar(loaded), indent=2, sort_keys=True, allow_nan=False))
        return
    summary = _summary(loaded)
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
