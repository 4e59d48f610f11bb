"""``rollout-recovery stop DIR``: ask the job running in DIR to drain.

Exit codes: 0 the drain was asked for (with ``--wait``: and the job has ended); 1 no
live job holds DIR, nothing was written; 2 DIR is not a run directory; 3 ``--wait
--timeout`` ran out with the job still running.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..errors import NotARunDirectoryError
from ..job import request_stop
from ..rundir import RunDirectory

__all__ = ["stop"]


@click.command()
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--wait", is_flag=True, help="Wait until the job has ended.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=None,
    help="With --wait: give up after this many seconds (exit 3).",
)
def stop(out: Path, wait: bool, timeout: float | None) -> None:
    """Ask the job running in OUT to drain: it stops admitting, lets the attempts in
    flight finish for up to [job] drain_grace_s, checkpoints and exits 0. Its launched
    vLLM servers end with it (only a job that dies leaves them for a rerun to adopt).

    It writes the job's drain file ([job] drain_file, by default OUT/DRAIN), which works
    from another container or user that can write into OUT. Exit 0: asked (with --wait:
    the job has ended); 1: no live job holds OUT; 2: OUT is not a run directory; 3: the
    --timeout ran out.
    """
    try:
        request = request_stop(out)
    except NotARunDirectoryError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(2)
    except OSError as error:
        click.echo(f"error: could not write the drain file: {error}", err=True)
        sys.exit(2)
    if request is None:
        click.echo(f"no live job holds {out}: nothing to stop")
        sys.exit(1)
    holder = f"pid {request.pid}" if request.pid is not None else "pid unknown"
    click.echo(
        f"asked the job in {out} ({holder}) to drain (wrote {request.drain_file}); attempts "
        f"in flight get up to {request.grace_s:g} s, then it checkpoints and exits"
    )
    if not wait:
        return
    run = RunDirectory(out)
    if not run.wait_unlocked(timeout=timeout):
        click.echo(f"the job in {out} is still running after {timeout:g} s")
        sys.exit(3)
    click.echo(_how_it_ended(run, request.pid))


def _how_it_ended(run: RunDirectory, pid: int | None) -> str:
    try:
        entries = list(run.read_run_log())
    except ValueError:
        entries = []
    drains = [e for e in entries if e.event == "drain" and (pid is None or e.pid == pid)]
    if drains:
        last = drains[-1]
        return f"the job drained at step {last.step} (checkpoint {last.checkpoint})"
    return "the job ended without recording a drain (it finished or failed: see its output)"
