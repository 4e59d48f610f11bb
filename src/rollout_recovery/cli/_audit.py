"""``rollout-recovery audit DIR``: check a run's invariants from its trail and checkpoints."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from ..errors import NotARunDirectoryError
from ..history import audit_run

__all__ = ["audit"]

# Enough to start debugging; --json lists every violation.
_SHOWN_VIOLATIONS = 20


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
def audit(run_dir: Path, as_json: bool) -> None:
    """Check a run's invariants: every record of its journal against the records that
    established what it states (each trained row against its seal, its prompt and its
    group's publish; each seal against the round that dispatched it; each restore against
    a replay of the journal after its snapshot); each group trained once with exactly N
    rows, no sibling or prompt trained twice, every prompt trained, dropped with a reason
    or still in flight, every seal trained unless a drop or a restore's discard says why;
    checkpoints complete and their rows present.

    Read-only; works on a run in progress by checking what it committed. The counts name
    the lineage its checkpoints' sidecars were read as (``sidecar_lineage``); a NeMo-RL
    Gym-lineage sidecar (attempt_index) is never read as this run's, and is a violation
    naming its lineage. Exit status: 0
    when every invariant holds, 1 on violations (the first ones are listed, each naming
    ids and file lines), 2 when RUN_DIR is not a run.
    """
    try:
        report = audit_run(run_dir)
    except NotARunDirectoryError as error:
        click.echo(f"rollout-recovery audit: {error}", err=True)
        sys.exit(2)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
        sys.exit(0 if report.ok else 1)
    console = Console()
    state = (
        "complete"
        if report.complete
        else f"in progress (committed through step {report.audited_through_step})"
    )
    verdict = "[green]PASS[/green]" if report.ok else "[red]FAIL[/red]"
    console.print(f"audit of {run_dir}: {verdict} — run {state}")
    table = Table(show_header=False)
    for name, value in report.counts.items():
        table.add_row(name, str(value))
    console.print(table)
    for violation in report.violations[:_SHOWN_VIOLATIONS]:
        console.print(f"violation: {violation}", markup=False, highlight=False, soft_wrap=True)
    hidden = len(report.violations) - _SHOWN_VIOLATIONS
    if hidden > 0:
        console.print(f"... and {hidden} more (use --json for all)")
    sys.exit(0 if report.ok else 1)
