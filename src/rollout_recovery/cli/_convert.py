"""``rollout-recovery convert SRC DST --to {native,pt}``: lossless, verified both ways."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import click

from .._durable import atomic_write_bytes
from ..checkpoint import SidecarFormat, load_sidecar
from ..errors import InvalidStateError, InvalidStateTypeError
from ._sidecar_errors import EXIT_INVALID, exit_on_bad_sidecar, fail, problem_line

__all__ = ["convert"]


@click.command("convert")
@click.argument("src", type=click.Path(path_type=Path))
@click.argument("dst", type=click.Path(path_type=Path))
@click.option(
    "--to",
    "target",
    type=click.Choice([format.value for format in SidecarFormat]),
    required=True,
    help="Format to write: native (MessagePack envelope) or pt (NeMo-RL, torch-loadable).",
)
@click.option("--force", is_flag=True, help="Replace DST if it exists.")
def convert(src: Path, dst: Path, target: str, force: bool) -> None:
    """Convert the sidecar SRC (a file or checkpoint directory) to DST in another format.

    SRC's format is detected from content and SRC is fully validated first. DST is written
    atomically, then read back and compared: the command fails rather than lose anything.
    A DST directory receives the conventional file name of the target format.
    """
    with exit_on_bad_sidecar(src):
        loaded = load_sidecar(src)
    format = SidecarFormat(target)
    destination = dst / format.filename if dst.is_dir() else dst
    if destination.exists() and not force:
        fail(f"{os.fspath(destination)!r} exists; pass --force to replace it", EXIT_INVALID)
    # The exact decode, not loaded.state: the loader normalizes what the ledger normalizes
    # (an int reward becomes a float), and a conversion must not change a byte of meaning.
    _, source_state = SidecarFormat.decode(SidecarFormat.read_bytes(loaded.path)[1])
    try:
        encoded = format.encode_state(source_state)
    except (InvalidStateError, InvalidStateTypeError) as error:
        fail(f"cannot write {target}: {problem_line(error)}", EXIT_INVALID)
    # Verified before anything is written, so a refusal leaves no destination behind.
    written_format, written = SidecarFormat.decode(encoded)
    if written_format != target or not same_state(written, source_state):
        fail(f"{os.fspath(destination)!r} would not read back unchanged", EXIT_INVALID)
    try:
        atomic_write_bytes(destination, encoded)
        _, data = SidecarFormat.read_bytes(destination)
    except OSError as error:
        fail(f"cannot write {os.fspath(destination)!r}: {error.strerror or error}", EXIT_INVALID)
    if data != encoded:
        destination.unlink(missing_ok=True)
        fail(f"{os.fspath(destination)!r} did not read back unchanged; removed", EXIT_INVALID)
    click.echo(
        f"converted {loaded.path} ({loaded.format}) -> {destination} ({target}): "
        f"{len(loaded.parsed.ledger_state['groups'])} groups, {len(data)} bytes"
    )


def same_state(left: Any, right: Any) -> bool:
    """Equality of two decoded sidecar trees in which NaN equals NaN.

    ``==`` says a NaN differs from itself, so every sidecar holding one (a NaN reward, a
    NaN metric) would fail a plain comparison although it converts faithfully. The walk
    runs only when ``==`` fails.
    """
    return bool(left == right) or _same_tree(left, right)


def _same_tree(left: Any, right: Any) -> bool:
    if type(left) is dict and type(right) is dict:
        return left.keys() == right.keys() and all(_same_tree(v, right[k]) for k, v in left.items())
    if type(left) is list and type(right) is list:
        return len(left) == len(right) and all(map(_same_tree, left, right))
    if type(left) is float and type(right) is float and math.isnan(left):
        return math.isnan(right)
    return bool(left == right)
