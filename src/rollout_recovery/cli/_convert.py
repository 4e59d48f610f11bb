"""``rollout-recovery convert SRC DST --to {native,pt}``: lossless, verified both ways."""

from __future__ import annotations

import os
from pathlib import Path

import click

from ..checkpoint import (
    SIDECAR_FORMATS,
    SidecarFormat,
    decode_sidecar,
    read_sidecar_bytes,
    sidecar_filename,
    write_sidecar,
)
from ..errors import InvalidStateError, InvalidStateTypeError
from ._sidecar_errors import EXIT_INVALID, fail, load_or_exit, problem_line

__all__ = ["convert"]


@click.command("convert")
@click.argument("src", type=click.Path(path_type=Path))
@click.argument("dst", type=click.Path(path_type=Path))
@click.option(
    "--to",
    "target",
    type=click.Choice(SIDECAR_FORMATS),
    required=True,
    help="Format to write: native (MessagePack envelope) or pt (NeMo-RL, torch-loadable).",
)
@click.option("--force", is_flag=True, help="Replace DST if it exists.")
def convert(src: Path, dst: Path, target: SidecarFormat, force: bool) -> None:
    """Convert the sidecar SRC (a file or checkpoint directory) to DST in another format.

    SRC's format is detected from content and SRC is fully validated first. DST is written
    atomically, then read back and compared: the command fails rather than lose anything.
    A DST directory receives the conventional file name of the target format.
    """
    loaded = load_or_exit(src)
    destination = dst / sidecar_filename(target) if dst.is_dir() else dst
    if destination.exists() and not force:
        fail(f"{os.fspath(destination)!r} exists; pass --force to replace it", EXIT_INVALID)
    # The exact decode, not loaded.state: the loader normalizes what the ledger normalizes
    # (an int reward becomes a float), and a conversion must not change a byte of meaning.
    _, source_state = decode_sidecar(read_sidecar_bytes(loaded.path)[1])
    try:
        write_sidecar(destination, source_state, format=target)
    except (InvalidStateError, InvalidStateTypeError) as error:
        fail(f"cannot write {target}: {problem_line(error)}", EXIT_INVALID)
    except OSError as error:
        fail(f"cannot write {os.fspath(destination)!r}: {error.strerror or error}", EXIT_INVALID)
    _, data = read_sidecar_bytes(destination)
    written_format, written = decode_sidecar(data)
    if written_format != target or written != source_state:
        fail(f"{os.fspath(destination)!r} does not read back unchanged", EXIT_INVALID)
    click.echo(
        f"converted {loaded.path} ({loaded.format}) -> {destination} ({target}): "
        f"{len(loaded.parsed.ledger_state['groups'])} groups, {len(data)} bytes"
    )
