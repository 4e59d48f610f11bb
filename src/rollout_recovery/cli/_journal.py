"""``rollout-recovery journal DIR``: what a run's write-ahead journal holds (read-only)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
import msgspec

from ..errors import NotARunDirectoryError
from ..history import JournalReport
from ..history.records import RECORD_TYPES

__all__ = ["journal", "render_journal_report"]

#: A listed record is shortened to this many characters in the human view (--json has it
#: whole).
_RECORD_WIDTH = 160


def _start(value: str | None) -> int | str | None:
    """``--from``: a byte offset, or a checkpoint name (``step_000010``)."""
    if value is None:
        return None
    text = value.strip()
    if text.isascii() and text.isdecimal():
        return int(text)
    return text


@click.command("journal")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option(
    "--from",
    "start",
    metavar="POS",
    help=(
        "List the records from byte offset POS on (the first record at or after it), or "
        "from a committed checkpoint's snapshot position (--from step_000010: what a "
        "restore from it replays)."
    ),
)
@click.option(
    "--type",
    "types",
    multiple=True,
    type=click.Choice(RECORD_TYPES),
    help="List only records of this type (repeatable).",
)
@click.option(
    "--limit",
    type=click.IntRange(min=0),
    help="List at most this many records.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON document.")
def journal(
    run_dir: Path, start: str | None, types: tuple[str, ...], limit: int | None, as_json: bool
) -> None:
    """Show what RUN_DIR's journal (events.jsonl) holds: its records by type with their
    count, bytes and first and last positions; the snapshot marks (each committed
    checkpoint's journal position, and what a restore from it would replay); a torn tail
    if there is one; every restore, with what it kept and discarded. --from, --type and
    --limit also list the records themselves.

    Read-only, and safe on a running job. Exit status: 0 when the journal reads whole (a
    torn tail, which the next restore cuts, is reported but is not a failure); 1 when a
    record before the end is damaged or a checkpoint's mark does not fit the journal
    (each problem names its file and byte offset); 2 when RUN_DIR is not a run.
    """
    try:
        report = JournalReport.inspect(run_dir, start=_start(start), types=types, limit=limit)
    except NotARunDirectoryError as error:
        click.echo(f"rollout-recovery journal: {error}", err=True)
        sys.exit(2)
    except ValueError as error:
        raise click.UsageError(str(error)) from None
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2, allow_nan=False))
    else:
        for line in render_journal_report(report):
            click.echo(line)
    sys.exit(0 if report.ok else 1)


def _n(value: int) -> str:
    return f"{value:,}"


def _at(place: dict[str, int] | None) -> str:
    return "-" if place is None else f"{_n(place['line'])} @ {_n(place['offset'])}"


def render_journal_report(report: JournalReport) -> list[str]:
    """The report for people: plain lines (one table per part)."""
    data = report.to_json()
    lines = [
        f"journal {data['journal']}: {_n(data['size'])} bytes, {_n(data['records'])} records "
        f"(history version {data['history_version']})"
    ]
    if data["live"]:
        lines.append(
            "live: a job holds this run directory; its last line may be an append in progress"
        )
    corrupt, torn = data["corrupt"], data["torn_tail"]
    if corrupt is not None:
        lines.append(f"DAMAGED: {corrupt['message']}")
        lines.append(f"  (records are shown up to byte {_n(data['end'])}, before the damage)")
    elif torn is not None:
        lines.append(
            f"torn tail: {_n(torn['bytes'])} bytes at byte {_n(torn['offset'])} "
            f"({torn['reason']}); the next restore cuts it"
        )
    else:
        lines.append(f"ends cleanly at byte {_n(data['end'])}")

    lines += ["", "records by type (line @ byte)"]
    lines.append(f"  {'type':<22}{'count':>8}{'bytes':>14}   {'first':<22}{'last':<22}")
    for name, item in data["by_type"].items():
        lines.append(
            f"  {name:<22}{_n(item['count']):>8}{_n(item['bytes']):>14}   "
            f"{_at(item['first']):<22}{_at(item['last']):<22}"
        )

    lines += ["", "snapshot marks (checkpoints/*/COMMITTED)"]
    if not data["snapshots"]:
        lines.append("  none committed")
    else:
        lines.append(f"  {'checkpoint':<14}{'step':>6}{'position':>14}{'line':>9}   replays")
    for mark in data["snapshots"]:
        position = "-" if mark["position"] is None else _n(mark["position"])
        line = "-" if mark["line"] is None else _n(mark["line"])
        replays = (
            f"unusable: {mark['problem']}"
            if mark["problem"]
            else f"{_count(mark['records_after'], 'record')}, {_count(mark['bytes_after'], 'byte')}"
        )
        lines.append(
            f"  {mark['checkpoint']:<14}{mark['step']:>6}{position:>14}{line:>9}   {replays}"
        )

    restores = data["restores"]
    lines += ["", f"restores ({len(restores)})"]
    for restore in restores:
        lines += _restore_lines(restore)

    if data["problems"]:
        lines += ["", "problems"]
        lines += [f"  {problem}" for problem in data["problems"]]

    listing = data["listing"]
    if listing is not None:
        kinds = ", ".join(listing["types"]) or "all types"
        limit = "" if listing["limit"] is None else f", limit {listing['limit']}"
        lines += [
            "",
            f"records from byte {_n(listing['from'])} ({kinds}{limit}): "
            f"{_n(listing['matched'])} matched, {_n(len(listing['records']))} shown",
        ]
        for item in listing["records"]:
            record: dict[str, Any] = dict(item["record"])
            event = record.pop("event")
            text = msgspec.json.encode(record).decode()
            if len(text) > _RECORD_WIDTH:
                text = text[: _RECORD_WIDTH - 1] + "…"
            lines.append(f"  {_n(item['line']):>7} @ {_n(item['offset']):>12}  {event}  {text}")
    return [line.rstrip() for line in lines]


def _count(value: int, noun: str) -> str:
    return f"{_n(value)} {noun}" + ("" if value == 1 else "s")


def _restore_lines(restore: dict[str, Any]) -> list[str]:
    rolled = restore["rolled_back_steps"]
    discarded = restore["discarded"]
    return [
        f"  line {_n(restore['line'])} @ {_n(restore['offset'])}: {restore['checkpoint']} "
        f"(journal position {_n(restore['snapshot_position'])}), training resumed at step "
        f"{restore['step']}, replayed {_n(restore['replayed_records'])} records, reuse "
        f"{restore['reuse']!r}, torn tail cut: {_n(restore['torn_tail_bytes'])} bytes",
        f"    kept: {_n(restore['groups_in_ledger'])} groups in the ledger, "
        f"{_n(restore['sealed_siblings_kept'])} sealed siblings "
        f"({_n(restore['tokens_reused'])} tokens), {_n(restore['canonical_groups'])} "
        f"finished groups ({_n(restore['canonical_tokens_kept'])} tokens)",
        f"    discarded: {_n(restore['seals_lost'])} seals ({_n(restore['tokens_lost'])} "
        f"tokens) by the reuse policy"
        + (
            " (" + ", ".join(f"{d['group_id']}/{d['generation_index']}" for d in discarded) + ")"
            if discarded
            else ""
        )
        + f"; {_n(restore['tokens_in_flight_lost'])} tokens of interrupted attempts; "
        + (
            "rolled back steps " + ", ".join(str(step) for step in rolled)
            if rolled
            else "no training rolled back"
        ),
    ]
