"""The root command group; each subcommand lives in its own module and registers here."""

from __future__ import annotations

import click

from .. import __version__
from ._audit import audit
from ._chaos import chaos
from ._convert import convert
from ._demo import demo
from ._export import export
from ._inspect import inspect
from ._journal import journal
from ._run import run
from ._serve import serve
from ._stop import stop
from ._validate import validate

__all__ = ["cli", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rollout-recovery")
def cli() -> None:
    """Crash-safe ownership of GRPO prompt groups for asynchronous RL."""


for _command in (demo, inspect, validate, convert, run, chaos, audit, serve, stop, journal, export):
    cli.add_command(_command)


def main() -> None:
    """Console-script entry point."""
    cli()
