"""Reading back what W&B offline mode wrote: its runs' ``.wandb`` transaction logs.

wandb 0.31 has no Python reader for these files any more (the old ``datastore`` module is
gone); its supported reader is the CLI, ``wandb leet inspect --json FILE``, which prints
one JSON record per line. The sink runs it once per earlier session, at open, to learn
the highest step W&B really holds (what a kill lost is not counted); the tests use it to
read back what was written.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

from ..errors import InvalidStateError

__all__ = ["WANDB_DIR", "history_steps", "offline_run_files", "read_records"]

#: wandb puts its runs in ``<dir>/wandb``; the sink passes the run directory as ``dir``.
WANDB_DIR: Final = "wandb"
_OFFLINE_RUN = re.compile(r"offline-run-(\d{8}_\d{6})-(.+?)(?:-(\d+))?\Z")
_READ_TIMEOUT_S: Final = 120.0


def offline_run_files(run_dir: Path, run_id: str) -> list[Path]:
    """The ``.wandb`` file of every offline session of run ``run_id``, oldest first."""
    found: list[tuple[str, int, Path]] = []
    wandb_dir = run_dir / WANDB_DIR
    if not wandb_dir.is_dir():
        return []
    for entry in wandb_dir.iterdir():
        match = _OFFLINE_RUN.match(entry.name)
        if match is None or match.group(2) != run_id:
            continue
        log = entry / f"run-{run_id}.wandb"
        if log.is_file():
            # Two sessions in one second: wandb adds "-1", "-2", ... to the second's name.
            found.append((match.group(1), int(match.group(3) or 0), log))
    return [path for _, _, path in sorted(found)]


def read_records(wandb_file: Path) -> list[dict[str, Any]]:
    """Every record of one ``.wandb`` file, as ``wandb leet inspect --json`` prints it."""
    # The CLI, not the wandb-core binary directly: the documented way in.
    env = {**os.environ, "WANDB_SILENT": "true"}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(wandb_file)],
            capture_output=True,
            text=True,
            timeout=_READ_TIMEOUT_S,
            env=env,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InvalidStateError(f"cannot read the W&B log: {exc}", file=str(wandb_file)) from exc
    if done.returncode != 0:
        raise InvalidStateError(
            f"`wandb leet inspect` failed ({done.returncode}): {done.stderr.strip()[-300:]}",
            file=str(wandb_file),
        )
    records: list[dict[str, Any]] = []
    for line in done.stdout.splitlines():
        if line.strip():
            record = json.loads(line)
            if isinstance(record, dict):
                records.append(record)
    return records


def history_steps(wandb_file: Path) -> list[int]:
    """The step of every history row in one ``.wandb`` file, in file order."""
    steps: list[int] = []
    for record in read_records(wandb_file):
        if record.get("type") == "history":
            step = record.get("history", {}).get("step", {}).get("num", 0)
            steps.append(int(step))
    return steps
