"""Exit codes and error reporting shared by ``inspect``, ``validate`` and ``convert``.

0: the input is a valid sidecar (and the command did its job); 1: the input was decoded
but breaks the schema, one line per problem naming the field path; 2: the input cannot
be read at all (missing, not a sidecar, truncated, corrupted).
"""

from __future__ import annotations

import os
from typing import NoReturn

import click

from ..checkpoint import LoadedSidecar, load_sidecar
from ..errors import InvalidStateError, InvalidStateTypeError, SidecarFormatError

__all__ = ["EXIT_INVALID", "EXIT_OK", "EXIT_UNREADABLE", "fail", "load_or_exit", "problem_line"]

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_UNREADABLE = 2


def fail(message: str, code: int) -> NoReturn:
    click.echo(message, err=True)
    raise SystemExit(code)


def problem_line(error: InvalidStateError | InvalidStateTypeError) -> str:
    """``$.path: message`` for one schema error."""
    return f"{error.path or '$'}: {error.message}"


def load_or_exit(path: str | os.PathLike[str]) -> LoadedSidecar:
    """Load and fully validate a sidecar, or exit 2 (unreadable) / 1 (invalid)."""
    try:
        return load_sidecar(path)
    except SidecarFormatError as error:
        fail(f"unreadable sidecar {os.fspath(path)!r}: {error}", EXIT_UNREADABLE)
    except OSError as error:
        fail(f"cannot read {os.fspath(path)!r}: {error.strerror or error}", EXIT_UNREADABLE)
    except (InvalidStateError, InvalidStateTypeError) as error:
        fail(
            f"invalid sidecar {os.fspath(path)!r} (run `rollout-recovery validate` for every "
            f"problem): {problem_line(error)}",
            EXIT_INVALID,
        )
