"""Exit codes and error reporting shared by ``inspect``, ``validate`` and ``convert``.

0: the input is a valid sidecar (and the command did its job); 1: the input was decoded
but breaks the schema, one line per problem naming the field path; 2: the input cannot
be read at all (missing, not a sidecar, truncated, corrupted).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import click

from ..errors import InvalidStateError, InvalidStateTypeError, SidecarFormatError

__all__ = [
    "EXIT_INVALID",
    "EXIT_OK",
    "EXIT_UNREADABLE",
    "exit_on_bad_sidecar",
    "fail",
    "problem_line",
]

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_UNREADABLE = 2


def fail(message: str, code: int) -> NoReturn:
    click.echo(message, err=True)
    raise SystemExit(code)


def problem_line(error: InvalidStateError | InvalidStateTypeError) -> str:
    """``$.path: message`` for one schema error."""
    return f"{error.path or '$'}: {error.message}"


@contextmanager
def exit_on_bad_sidecar(path: str | os.PathLike[str]) -> Iterator[None]:
    """Exit 2 when the body finds ``path`` unreadable as a sidecar, 1 when it is invalid.

    Wraps ``load_sidecar(path)``: a command goes on only with a fully validated sidecar.
    """
    try:
        yield
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
