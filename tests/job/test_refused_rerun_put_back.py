"""A refused rerun of a run whose last re-save was killed between its two renames leaves
the run directory as it found it (issue 28's hardening).

A killed re-save of ``step_N`` leaves the committed checkpoint aside as
``.replaced-step_N-<hex>``. A rerun puts it back before it chooses the newest checkpoint
(``CheckpointStore.put_back_replaced``), so that checkpoint is restored; a rerun then
refused (a history cut back, fewer steps than taken) used to leave it put back, a change
by a run that changed nothing else. It is now put aside again
(``CheckpointStore.undo_put_back``): every name and every byte as before, the lock file's
pid aside (the refused process takes the directory's lock first and names itself there).
Each rename moves one committed checkpoint between its two names, both of which a rerun
recognizes, so a kill at any point loses nothing: the accepted rerun at the end restores
the checkpoint that was aside.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rollout_recovery.control import RunConfig
from rollout_recovery.errors import ConfigError, RunNotResumableError
from rollout_recovery.history._trail_reader import read_entries
from rollout_recovery.job import run_job

Snapshot = Callable[[Path], dict[str, Any]]

ASIDE = ".replaced-{name}-0a1b2c3d"


def _listing_and_bytes(snapshot: dict[str, Any]) -> dict[str, tuple[int, str]]:
    """Every path with its size and SHA-256, mtimes left out (renaming a checkpoint out
    and back changes its parent's), the lock file's bytes left out (its pid)."""
    return {
        name: (size, "" if name == ".lock" else digest)
        for name, (size, _, digest) in snapshot.items()
    }


def _cut_history_between_the_two_newest(out: Path) -> None:
    """A journal cut back between the two newest checkpoints: refused at once."""
    events = out / "events.jsonl"
    synced = sorted(
        json.loads(manifest.read_text())["marks"]["events.jsonl"]
        for manifest in (out / "checkpoints").glob("step_*/COMMITTED")
    )
    previous_at, newest_at = synced[-2:]
    cut = next(e.offset for e in read_entries(events) if previous_at < e.offset < newest_at)
    os.truncate(events, cut)


REFUSALS: dict[str, tuple[Callable[[Path], None], int, type[Exception]]] = {
    # Refused right after the put-back, before any server or store is opened.
    "history cut back": (_cut_history_between_the_two_newest, 10, RunNotResumableError),
    # Refused once the checkpoint put back was chosen and read, the data plane open.
    "fewer steps than taken": (lambda out: None, 1, ConfigError),
}


@pytest.mark.parametrize("refusal", REFUSALS)
def test_a_refused_rerun_leaves_a_checkpoint_a_killed_resave_set_aside_where_it_was(
    finished_run: tuple[Path, RunConfig],
    fast_config: Callable[..., RunConfig],
    dir_snapshot: Snapshot,
    refusal: str,
) -> None:
    out, _ = finished_run
    damage, steps, refused = REFUSALS[refusal]
    newest = sorted((out / "checkpoints").glob("step_*"))[-1]
    damage(out)
    # A re-save of the newest checkpoint killed between its two renames.
    aside = newest.with_name(ASIDE.format(name=newest.name))
    os.rename(newest, aside)
    before = _listing_and_bytes(dir_snapshot(out))

    with pytest.raises(refused):
        run_job(out, fast_config({"job": {"steps": steps}}))

    assert aside.is_dir() and not newest.exists()
    assert _listing_and_bytes(dir_snapshot(out)) == before


def test_an_accepted_rerun_keeps_the_checkpoint_it_put_back(
    finished_run: tuple[Path, RunConfig], fast_config: Callable[..., RunConfig]
) -> None:
    out, _ = finished_run
    newest = sorted((out / "checkpoints").glob("step_*"))[-1]
    aside = newest.with_name(ASIDE.format(name=newest.name))
    os.rename(newest, aside)

    result = run_job(out, fast_config({"job": {"steps": 11}}))

    assert result.restored is not None and result.restored.checkpoint == newest.name
    assert not aside.exists()
