"""``rollout-recovery convert SRC DST --to {native,pt}``: lossless, verified both ways.

A conversion changes the file format only, never the lineage: a Gym-lineage sidecar
(numeric ``attempt_index``) converts to a Gym-lineage file, a uuid-lineage one to a
uuid-lineage file. There is no conversion between lineages, because an attempt of one is
never an attempt of the other: a sealed attempt's receipt names its gate id
(``<logical>-a<N>`` or ``<logical>_a<uuid hex>``) and its staged rows are keyed by it, so
a fresh identity would either contradict the receipt (the ledger refuses it) or rewrite it
to name rows that do not exist; the lineages' extra fields (Gym completion receipts and
acknowledgements owed; uuid reward checks, settings and finalizer observations) have no
counterpart either. ``--lineage`` states the lineage a caller expects, and a file of the
other is refused (docs/nemo-rl-lineages.md).
"""

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

_LINEAGES = ("uuid", "gym")


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
@click.option(
    "--lineage",
    type=click.Choice(_LINEAGES),
    default=None,
    help=(
        "The lineage SRC must be (uuid: attempt_uuid, what this package restores; gym: "
        "NeMo-RL's attempt_index line). A conversion never changes a lineage, so SRC of the "
        "other one is refused. Default: whichever SRC is."
    ),
)
@click.option("--force", is_flag=True, help="Replace DST if it exists.")
def convert(src: Path, dst: Path, target: str, lineage: str | None, force: bool) -> None:
    """Convert the sidecar SRC (a file or checkpoint directory) to DST in another format.

    SRC's format and lineage are detected from content and SRC is fully validated by its
    lineage's rules first. DST keeps the lineage (there is no conversion between
    lineages), is written atomically, then read back and compared: the command fails
    rather than lose anything. A DST directory receives the conventional file name of the
    target format.
    """
    with exit_on_bad_sidecar(src):
        loaded = load_sidecar(src)
    if lineage is not None and lineage != loaded.lineage:
        fail(
            f"{os.fspath(src)!r} holds lineage {loaded.lineage.describe()}, not {lineage}: a "
            "conversion never changes a sidecar's lineage (an attempt of one lineage is never "
            "an attempt of the other: its receipt and staged rows are keyed by its gate id)",
            EXIT_INVALID,
        )
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
    # The lineage is told from content, so an unchanged state keeps it.
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
        f"converted {loaded.path} ({loaded.format}) -> {destination} ({target}): lineage "
        f"{loaded.lineage.value} kept ({loaded.lineage.attempt_identity}), "
        f"{len(source_state['groups'])} groups, {len(data)} bytes"
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
