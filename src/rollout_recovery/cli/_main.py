"""The root command group; each subcommand lives in its own module and registers here."""

from __future__ import annotations

import click

from .. import __version__

__all__ = ["cli", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rollout-recovery")
def cli() -> None:
    """Crash-safe ownership of GRPO prompt groups for asynchronous RL."""


def _register() -> None:
    # Imported here, not at module top, so that ``_main`` has no import cycle with the
    # command modules (they import ``cli`` helpers from the package).
    from ._demo import demo

    cli.add_command(demo)
    from ._inspect import inspect

    cli.add_command(inspect)
    from ._validate import validate

    cli.add_command(validate)
    from ._convert import convert

    cli.add_command(convert)
    from ._run import run

    cli.add_command(run)
    from ._chaos import chaos

    cli.add_command(chaos)
    from ._audit import audit

    cli.add_command(audit)
    from ._serve import serve

    cli.add_command(serve)
    from ._stop import stop

    cli.add_command(stop)
    from ._journal import journal

    cli.add_command(journal)


_register()


def main() -> None:
    """Console-script entry point."""
    cli()
