"""``rollout-recovery validate PATH``: every problem of a sidecar, one line each."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from ..checkpoint import SidecarFormat
from ..errors import InvalidStateError, InvalidStateTypeError, SidecarFormatError
from ._sidecar_errors import EXIT_INVALID, EXIT_OK, EXIT_UNREADABLE, fail, problem_line

__all__ = ["validate"]


@click.command("validate")
@click.argument("path", type=click.Path(path_type=Path))
def validate(path: Path) -> None:
    """Check a sidecar file (or a checkpoint directory's) against the full schema of its
    lineage.

    Exit 0 when valid; 1 with one line per problem, each naming the field path; 2 when
    PATH cannot be read as a sidecar at all. The format and the lineage (uuid: attempts
    named by attempt_uuid, this package's; gym: NeMo-RL's attempt_index line) are detected
    from content and named, on stdout when valid and on stderr after the problems.
    """
    try:
        resolved, data = SidecarFormat.read_bytes(path)
        format, state = SidecarFormat.decode(data)
    except SidecarFormatError as error:
        fail(f"unreadable sidecar {os.fspath(path)!r}: {error}", EXIT_UNREADABLE)
    except OSError as error:
        fail(f"cannot read {os.fspath(path)!r}: {error.strerror or error}", EXIT_UNREADABLE)
    except (InvalidStateError, InvalidStateTypeError) as error:
        # Only the native decoder gets here: its typed payload decode stops at one fault.
        problems = SidecarFormat.find_problems(data)
        lines = [str(problem) for problem in problems]
        # The typed decoder is stricter in places (a bool where an int belongs), so its own
        # fault is listed too unless the validators already named that field.
        if (error.path or "$") not in {problem.path for problem in problems}:
            lines.append(problem_line(error))
        click.echo("\n".join(lines))
        _name_what_was_read(path, "native", data, len(lines))
        raise SystemExit(EXIT_INVALID) from None
    problems = SidecarFormat.find_problems(state)
    if problems:
        click.echo("\n".join(str(problem) for problem in problems))
        _name_what_was_read(path, format, state, len(problems))
        raise SystemExit(EXIT_INVALID)
    lineage = SidecarFormat.lineage(state)
    groups = len(state["groups"])
    click.echo(
        f"{resolved}: valid {format} sidecar of lineage {lineage.describe()}, {groups} groups"
    )
    raise SystemExit(EXIT_OK)


def _name_what_was_read(path: Path, format: str, state: Any, count: int) -> None:
    """One stderr line after the problems: how many, and as which lineage they were read."""
    try:
        lineage = f"read as lineage {SidecarFormat.lineage(state).describe()}"
    except (InvalidStateError, InvalidStateTypeError):
        lineage = "its lineage cannot be told (see the problems)"
    noun = "problem" if count == 1 else "problems"
    click.echo(f"{os.fspath(path)}: invalid {format} sidecar, {count} {noun}; {lineage}", err=True)
