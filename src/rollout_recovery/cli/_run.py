"""``rollout-recovery run``: start, or resume after any kill, the main job."""

from __future__ import annotations

import errno
import sys
from pathlib import Path

import click
from rich.console import Console

from .._settings import config_to_toml
from ..control import BACKENDS, load_config
from ..errors import (
    ConfigError,
    JobMismatchError,
    RolloutRecoveryError,
    RunDirectoryLockedError,
)
from ..job import RunReporter, run_job
from ..rundir import RunDirectory
from ._standby import standby_for

__all__ = ["run"]


@click.command()
@click.option(
    "--out",
    "out",
    type=click.Path(file_okay=False, path_type=Path),
    help="Run directory. If it holds a committed checkpoint of the same job, the run resumes.",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="TOML job configuration (see --print-config for every key and its default).",
)
@click.option("--seed", type=click.IntRange(min=0), help="Overrides job.seed.")
@click.option(
    "--backend",
    type=click.Choice(list(BACKENDS)),
    help="Overrides generation.backend: "
    + "; ".join(f"{name}: {entry.summary}" for name, entry in BACKENDS.items())
    + ".",
)
@click.option("--print-config", is_flag=True, help="Print the configuration as TOML and exit.")
@click.option("--plain", is_flag=True, help="Plain log lines even on a terminal.")
def run(
    out: Path | None,
    config_path: Path | None,
    seed: int | None,
    backend: str | None,
    print_config: bool,
    plain: bool,
) -> None:
    """Run asynchronous GRPO that survives any kill: rerun the same command to resume.

    With no --config it runs the default job: a synthetic task set, simulated agent
    episodes with injected faults, and a numpy policy that learns, in about two minutes
    on two CPU cores. The run directory gets its history (events.jsonl, the write-ahead
    journal that `rollout-recovery audit` and `journal` read), metrics.jsonl, reward.png
    and its checkpoints.

    SIGTERM, Ctrl-C, `rollout-recovery stop DIR` or the drain file ([job] drain_file)
    drain it: admission stops, attempts in flight get [job] drain_grace_s to finish, a
    checkpoint is taken and it exits 0; a second Ctrl-C stops it at once (exit 130).
    """
    # Without --config, a run directory's own job.toml is the config: rerunning with only
    # --out resumes the job the directory holds.
    if config_path is None and out is not None and RunDirectory(out).job_file.is_file():
        config_path = RunDirectory(out).job_file
    try:
        config = load_config(config_path, seed=seed, backend=backend)
    except ConfigError as error:
        raise click.UsageError(str(error)) from None
    if print_config:
        click.echo(config_to_toml(config), nl=False)
        return
    if out is None:
        raise click.UsageError("Missing option '--out'.")
    console = Console(stderr=False)
    with RunReporter(console, force_plain=plain) as reporter:
        try:
            with standby_for(
                out,
                config.job.standby_within_s,
                with_torch=config.trainer.kind == "torch",
                log=reporter.log,
            ):
                result = run_job(out, config, progress=reporter, log=reporter.log)
        except KeyboardInterrupt:
            # A second Ctrl-C during a drain, or one before the job could drain.
            reporter.log(
                "stopped without draining; rerun the same command to resume from the last "
                "checkpoint and the journal"
            )
            sys.exit(130)
        except OSError as error:
            if error.errno != errno.ENOSPC:
                raise
            where = f" ({error.filename})" if error.filename else ""
            reporter.log(
                f"error: the run stopped: no space left on device{where}. The previous "
                "checkpoint is intact: free space and rerun the same command to resume."
            )
            sys.exit(1)
        except ConfigError as error:
            # Found only once the job looks at its parts: a missing extra, a model source
            # that is not a model.
            reporter.log(f"error: {error}")
            sys.exit(2)
        except (JobMismatchError, RunDirectoryLockedError) as error:
            reporter.log(f"error: {error}")
            sys.exit(2)
        except RolloutRecoveryError as error:
            reporter.log(f"error: the run stopped: {type(error).__name__}: {error}")
            if error.rerun_resumes:
                reporter.log("rerun the same command to resume from the last committed checkpoint")
            sys.exit(1)
    try:
        result.summary.render(console)
        click.echo(f"audit trail, metrics and reward.png are in {out}")
        if result.drained is not None:
            click.echo(
                f"drained at step {result.drained.step} of {config.job.steps} (checkpoint "
                f"{result.drain_checkpoint}); rerun the same command to resume: "
                f"rollout-recovery run --out {out}"
            )
    except (BrokenPipeError, ValueError):
        RunReporter.silence_closed_stdout()  # the reader went away; the run itself is done
