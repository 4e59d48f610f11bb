"""``rollout-recovery chaos``: kill the real job K times, rerun it to the end, audit it.

The job runs as ``python -m rollout_recovery run --out OUT --plain`` in a child process
group of its own (``start_new_session=True``), with stdout and stderr merged into one line
stream. Each planned kill is one of:

- a *random moment*: the harness SIGKILLs the whole group right after the child printed
  its N-th output line. The harness synchronizes on what the child printed, never on
  sleeps, so the same schedule means the same kill points in the run's own progress;
- a *named crash point* (:data:`CRASH_POINTS`) armed as ``name:N`` through
  ``ROLLOUT_RECOVERY_CRASH_AT``: the child SIGKILLs itself at the N-th hit, inside a
  checkpoint write, between a put and a discard, and so on.

A *torn tail* (``journal.before_cut``) needs what a SIGKILL never makes, a journal write
torn by a power cut: before that child starts, the harness appends the first bytes of a
record without its end (:data:`TORN_RECORD`) to ``events.jsonl``, as a machine that lost
power mid-append leaves it, and arms the crash point at the restore's cut of that tail.

A kill is verified: the child died of SIGKILL (return code -9) and, for a crash point,
printed ``crash point <name> fired``. A child that finished (exit 0) before its kill came
is reported as "not reached", not as a kill, and the run is then complete, so the rest of
the schedule is "not reached" too. After the schedule the job is rerun, unarmed, until it
exits 0 (at most ``max_final_reruns`` times), then audited (:func:`audit_run`).

The schedule comes from ``random.Random(seed)`` alone, given the job's shape (the ranges
of N scale with the job's steps and checkpoint interval, so kills land inside the run):
the same seed and config give the same schedule (:func:`plan_kills`).

What the report measures, and where it reads it:

- sealed siblings reused vs regenerated, and the tokens reused and wasted, come from each
  restore's ``restored`` record, read from ``events.jsonl`` right after the child that
  wrote it (the child's "resumed from" line says it got that far). Per kill, "tokens
  wasted" is every generated token the restore threw away (``Restored.tokens_regenerated``):
  the seals its reuse policy discarded (``tokens_lost``) plus the calls staged by attempts
  the kill interrupted (``tokens_in_flight_lost``); "tokens unsealed at the kill" is the
  second part alone.
  With ``reuse = "all"`` no seal is discarded, so the two are equal: only unsealed work
  is lost. (Calls still running at the kill were never staged and are counted nowhere.)
  With ``[recovery] resume = "call"`` the staged calls of interrupted attempts are kept
  for their siblings to continue, so only prompt-group cohorts' and refused ones count
  (``cohort_tokens_in_flight_lost`` is the cohorts' part); ``tokens_resumable`` says
  what the restores kept.
- the longest checkpoint stall is read from the final run's summary line ("longest
  checkpoint stall"), or, failing that, from the ``checkpoint_committed`` records of the
  history, each of which says its own stall.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._crashpoints import CRASH_AT_ENV, CRASH_POINTS
from ..control import RunConfig, load_config
from ..errors import (
    InvalidArgumentError,
    NotARunDirectoryError,
    RolloutRecoveryError,
    TrailLineError,
)
from ..history import AuditTrail, audit_run
from ..history.records import CheckpointCommitted, Restored
from ..rundir import CheckpointStore, RunDirectory
from ._render import render_chaos_report

if TYPE_CHECKING:
    from rich.console import Console

__all__ = [
    "RANDOM",
    "TORN_RECORD",
    "UNPLANNED_POINTS",
    "AuditVerdict",
    "ChaosReport",
    "KillOutcome",
    "KillRanges",
    "PlannedKill",
    "plan_kills",
    "run_chaos",
]

#: The label of kills at a random moment (beside the crash point names).
RANDOM = "random"

#: Reruns after the schedule before the harness gives up on the run finishing.
DEFAULT_MAX_FINAL_RERUNS = 20

#: How many violations the report keeps (the count is always complete).
FIRST_VIOLATIONS = 20

#: Lines of a child's output quoted when something about it went wrong.
_TAIL_LINES = 12

_FIRED_RE = re.compile(r"crash point (\S+) fired")
_STALL_RE = re.compile(r"longest checkpoint stall\s*\S\s*([0-9]+(?:\.[0-9]+)?) s")
_RESUMED_PREFIX = "resumed from "


@dataclass(frozen=True, slots=True)
class PlannedKill:
    """One kill of the schedule: ``point`` None is a random moment.

    ``count`` is, for a random moment, the output line after which the harness kills the
    child; for a crash point, the hit that fires (``ROLLOUT_RECOVERY_CRASH_AT=point:count``).
    """

    point: str | None
    count: int

    def __post_init__(self) -> None:
        if self.point is not None and self.point not in CRASH_POINTS:
            raise InvalidArgumentError(f"unknown crash point {self.point!r}", path="$.point")
        if self.count < 1:
            raise InvalidArgumentError(f"count must be >= 1, got {self.count}", path="$.count")

    @property
    def label(self) -> str:
        return RANDOM if self.point is None else self.point

    @property
    def armed(self) -> str | None:
        """The ``ROLLOUT_RECOVERY_CRASH_AT`` value, or None for a random moment."""
        return None if self.point is None else f"{self.point}:{self.count}"

    def describe(self) -> str:
        if self.point is None:
            return f"kill after output line {self.count}"
        return f"crash point {self.armed}"

    def to_json(self) -> dict[str, Any]:
        if self.point is None:
            return {"kind": RANDOM, "after_lines": self.count}
        return {"kind": "crash_point", "point": self.point, "hit": self.count}


@dataclass(frozen=True, slots=True)
class KillRanges:
    """Inclusive ranges the schedule draws N from, sized to the job so kills land in it.

    A random kill waits for at least 3 lines: the second line is the "starting a new run"
    log printed *before* the bootstrap checkpoint, the third comes after a trained step,
    so a random kill of a fresh run always leaves a checkpoint to restore.
    """

    after_lines: tuple[int, int]
    hits: Mapping[str, tuple[int, int]]

    @classmethod
    def for_config(cls, config: RunConfig) -> KillRanges:
        job, every = config.job, config.checkpoint.every_steps
        # Steps one kill may see: about two checkpoint intervals, never more than the job.
        span = max(1, min(job.steps, 2 * every))
        calls = job.prompts_per_step * job.generations_per_prompt
        return cls(
            after_lines=(3, 2 + max(2, span)),
            hits={
                # Hit 1 of a fresh run is the bootstrap checkpoint; of a resumed run, the
                # first checkpoint after the restore.
                "checkpoint.before_committed": (1, 2),
                "checkpoint.before_rename": (1, 2),
                "checkpoint.before_latest": (1, 2),
                # One hit per group published, per staged call, per trained step.
                "finalize.after_put": (1, max(1, job.prompts_per_step * span)),
                "capture.before_ack": (1, max(1, calls * span)),
                "train.before_clear": (1, max(1, min(every, job.steps))),
                # A process restores once, replaying the journal once.
                "restore.mid": (1, 1),
                "replay.mid": (1, 1),
                # Journal records: several per call (rounds, seals, publishes, steps); one
                # sync per seal or step at most (group commit shares them).
                "journal.after_append": (1, max(1, 2 * calls * span)),
                "journal.after_fsync": (1, max(1, calls * span)),
                # Per checkpoint.
                "snapshot.in_hold": (1, 2),
                "checkpoint.captured": (1, 2),
                "snapshot.before_write": (1, 2),
                # The restore's cut of the torn tail the harness made (once per process).
                "journal.before_cut": (1, 1),
            },
        )


#: Crash points the plan never draws, since the chaos job launches no vLLM server and no
#: warm standby: ``adopt.before_handover`` (``tests/vllm`` kills a job there),
#: ``vllm.push_loaded`` (``tests/integration/llm/test_vllm_llm_job.py`` arms it against
#: real vLLM) and the standby's hand-over (``standby.*``: ``tests/cli/test_standby.py``).
#: The one a kill cannot reach on its own, ``journal.before_cut``, is reached by tearing
#: the journal first, see :data:`TORN_RECORD`.
UNPLANNED_POINTS: frozenset[str] = frozenset(
    {
        "adopt.before_handover",
        "vllm.push_loaded",
        "standby.before_fork",
        "standby.after_handover",
        "standby.child_started",
    }
)

#: Points only a resumed child reaches (a fresh one has nothing to restore).
_RESUME_POINTS = frozenset({"restore.mid", "replay.mid", "journal.before_cut"})

#: What a power cut leaves of a journal append in progress: a record's first bytes, no
#: newline, so no checksum can match. Written by the harness before a ``journal.before_cut``
#: child (the record never completed, so nothing was acknowledged by it).
TORN_RECORD = b'{"crc":"00000000","event":"sibling_sealed","group_id":"g00'


def plan_kills(kills: int, seed: int, ranges: KillRanges) -> list[PlannedKill]:
    """The kill schedule: a function of ``(kills, seed, ranges)`` only.

    Each kill is a random moment or a crash point with probability 1/2. A point only a
    restore reaches (``restore.mid``, ``replay.mid``, ``journal.before_cut``) is never
    planned while the run would still be fresh (nothing committed to restore):
    only the first child, and a child after one killed at hit 1 of
    ``checkpoint.before_committed`` / ``before_rename`` of a fresh run (its bootstrap
    checkpoint never got published), are fresh.
    """
    if kills < 0:
        raise InvalidArgumentError(f"kills must be >= 0, got {kills}", path="$.kills")
    rng = random.Random(seed)
    # Sorted: a frozenset's order of strings changes with hash randomization.
    points = sorted(CRASH_POINTS - UNPLANNED_POINTS)
    plan: list[PlannedKill] = []
    fresh = True
    for _ in range(kills):
        if rng.random() < 0.5:
            low, high = ranges.after_lines
            planned = PlannedKill(None, rng.randint(low, high))
        else:
            choices = [p for p in points if not (fresh and p in _RESUME_POINTS)]
            point = rng.choice(choices)
            low, high = ranges.hits[point]
            planned = PlannedKill(point, rng.randint(low, high))
        plan.append(planned)
        fresh = (
            fresh
            and planned.point
            in (
                "checkpoint.before_committed",
                "checkpoint.before_rename",
            )
            and planned.count == 1
        )
    return plan


@dataclass(frozen=True, slots=True)
class KillOutcome:
    """What became of one child: a planned kill, or a final rerun (``planned`` None).

    ``result``: ``killed`` (verified), ``not reached`` (it finished first, or there was
    nothing to restore), ``finished`` (a final rerun exited 0), ``failed`` (an exit 1 of
    a final rerun, which the next rerun resumes) or ``error`` (a failed verification).
    """

    run: int | None
    planned: PlannedKill | None
    result: str
    returncode: int | None
    seconds: float
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "planned": None if self.planned is None else self.planned.to_json(),
            "result": self.result,
            "returncode": self.returncode,
            "seconds": round(self.seconds, 3),
            "detail": self.detail,
        }


@dataclass(frozen=True, slots=True)
class AuditVerdict:
    """The auditor's verdict, its counts and the first violations."""

    ok: bool
    counts: dict[str, int]
    violation_count: int
    first_violations: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": "pass" if self.ok else "fail",
            "counts": dict(self.counts),
            "violation_count": self.violation_count,
            "first_violations": list(self.first_violations),
        }


def _audit(run_dir: Path) -> AuditVerdict:
    """The one place the harness calls the auditor."""
    try:
        report = audit_run(run_dir)
    except NotARunDirectoryError as error:
        return AuditVerdict(False, {}, 1, [str(error)])
    return AuditVerdict(
        ok=report.ok,
        counts=dict(report.counts),
        violation_count=len(report.violations),
        first_violations=report.violations[:FIRST_VIOLATIONS],
    )


@dataclass(slots=True)
class ChaosReport:
    """Everything one chaos run did and found; ``ok`` is the exit-0 condition."""

    seed: int
    out: Path
    config_path: Path | None
    schedule: list[PlannedKill]
    outcomes: list[KillOutcome] = field(default_factory=list)
    finished: bool = False
    runs: int = 0
    restores: int = 0
    sealed_reused: int = 0
    #: Journaled seals the restores' reuse policy discarded (their siblings run again).
    sealed_regenerated: int = 0
    tokens_reused: int = 0
    #: One entry per restore: every generated token it threw away (discarded seals and
    #: the staged calls of interrupted attempts).
    tokens_wasted: list[int] = field(default_factory=list)
    #: One entry per restore: the tokens of attempts that were not sealed at the kill.
    tokens_unsealed: list[int] = field(default_factory=list)
    #: Journal records the restores replayed after their snapshots, and torn tails cut.
    replayed_records: int = 0
    torn_tails_cut: int = 0
    #: Per restore: the prompt-group cohorts' part of the unsealed tokens, and the staged
    #: tokens kept for call-level resumption.
    cohort_tokens_in_flight_lost: list[int] = field(default_factory=list)
    tokens_resumable: list[int] = field(default_factory=list)
    longest_checkpoint_stall_s: float | None = None
    stall_source: str = "none"
    wall_time_s: float = 0.0
    audit: AuditVerdict | None = None
    failures: list[str] = field(default_factory=list)

    @property
    def kills(self) -> int:
        return sum(1 for outcome in self.outcomes if outcome.result == "killed")

    @property
    def kills_by_point(self) -> dict[str, int]:
        return dict(sorted(self._count("killed").items()))

    @property
    def not_reached_by_point(self) -> dict[str, int]:
        return dict(sorted(self._count("not reached").items()))

    def _count(self, result: str) -> Counter[str]:
        return Counter(
            outcome.planned.label
            for outcome in self.outcomes
            if outcome.planned is not None and outcome.result == result
        )

    @property
    def final_reruns(self) -> int:
        return sum(1 for outcome in self.outcomes if outcome.planned is None)

    @property
    def ok(self) -> bool:
        return self.finished and not self.failures and self.audit is not None and self.audit.ok

    def render(self, console: Console) -> None:
        """Print the report as tables and the audit's verdict (:func:`render_chaos_report`)."""
        render_chaos_report(self, console)

    def to_json(self) -> dict[str, Any]:
        wasted, unsealed = self.tokens_wasted, self.tokens_unsealed
        return {
            "ok": self.ok,
            "seed": self.seed,
            "out": str(self.out),
            "config": None if self.config_path is None else str(self.config_path),
            "kills_planned": len(self.schedule),
            "kills": self.kills,
            "kills_by_point": self.kills_by_point,
            "not_reached_by_point": self.not_reached_by_point,
            "finished": self.finished,
            "runs": self.runs,
            "final_reruns": self.final_reruns,
            "restores": self.restores,
            "sealed_siblings": {
                "reused": self.sealed_reused,
                "regenerated": self.sealed_regenerated,
            },
            "tokens": {
                "reused": self.tokens_reused,
                "wasted_total": sum(wasted),
                "wasted_per_kill_mean": (sum(wasted) / len(wasted)) if wasted else 0.0,
                "wasted_per_kill_max": max(wasted, default=0),
                "unsealed_total": sum(unsealed),
                "unsealed_per_kill_mean": (sum(unsealed) / len(unsealed)) if unsealed else 0.0,
                "unsealed_per_kill_max": max(unsealed, default=0),
                # Restores that threw away more than the unsealed work (sealed tokens).
                "kills_wasting_more_than_unsealed": sum(
                    1 for lost, open_ in zip(wasted, unsealed, strict=True) if lost > open_
                ),
                "cohort_in_flight_regenerated_per_kill": _mean_max(
                    self.cohort_tokens_in_flight_lost
                ),
                "resumable_per_kill": _mean_max(self.tokens_resumable),
            },
            "replayed_records": self.replayed_records,
            "torn_tails_cut": self.torn_tails_cut,
            "longest_checkpoint_stall_s": self.longest_checkpoint_stall_s,
            "stall_source": self.stall_source,
            "wall_time_s": round(self.wall_time_s, 3),
            "audit": None if self.audit is None else self.audit.to_json(),
            "failures": list(self.failures),
            "schedule": [planned.to_json() for planned in self.schedule],
            "outcomes": [outcome.to_json() for outcome in self.outcomes],
        }


def _mean_max(values: Sequence[int]) -> dict[str, float]:
    """Mean, max and total of per-restore counts (zeros for none)."""
    return {
        "mean": (sum(values) / len(values)) if values else 0.0,
        "max": max(values, default=0),
        "total": sum(values),
    }


# ------------------------------------------------------------------------------ children


@dataclass(frozen=True, slots=True)
class _Child:
    returncode: int
    lines: list[str]
    killed_after_lines: bool
    timed_out: bool
    seconds: float

    def tail(self) -> str:
        return "".join(self.lines[-_TAIL_LINES:]).rstrip()


def _child_env(armed: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop(CRASH_AT_ENV, None)
    env["PYTHONUNBUFFERED"] = "1"  # every line reaches the pipe when printed
    env["COLUMNS"] = "200"  # one line per log message; the summary table unwrapped
    if armed is not None:
        env[CRASH_AT_ENV] = armed
    return env


def _run_child(
    argv: Sequence[str], env: Mapping[str, str], *, kill_after_lines: int | None, timeout_s: float
) -> _Child:
    """Run one child to its end, or SIGKILL its group after ``kill_after_lines`` lines."""
    started = time.monotonic()
    process = subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env=dict(env),
        start_new_session=True,  # its own process group: one killpg reaches all of it
    )
    # Only this function reaps the child, and only after setting ``done`` under the lock,
    # so a kill under the lock always targets our group, never a reused id.
    lock = threading.Lock()
    done = False
    timed_out = threading.Event()

    def kill_group() -> None:
        with lock:
            if not done:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)

    def expire() -> None:
        timed_out.set()
        kill_group()

    watchdog = threading.Timer(timeout_s, expire)
    watchdog.daemon = True
    watchdog.start()
    lines: list[str] = []
    killed = False
    try:
        assert process.stdout is not None
        # Read to EOF even after the kill: the pipe closes once the whole group is dead.
        for line in process.stdout:
            lines.append(line)
            if not killed and kill_after_lines is not None and len(lines) >= kill_after_lines:
                kill_group()
                killed = True
    except BaseException:
        # Ctrl-C reaches only the harness (the child has its own session): take the child
        # down with it rather than leave it running unwatched.
        kill_group()
        raise
    finally:
        with lock:
            done = True
        watchdog.cancel()
        if process.stdout is not None:
            process.stdout.close()
        returncode = process.wait()
    return _Child(
        returncode=returncode,
        lines=lines,
        killed_after_lines=killed,
        timed_out=timed_out.is_set(),
        seconds=time.monotonic() - started,
    )


def _has_committed_checkpoint(out: Path) -> bool:
    return bool(CheckpointStore(out, keep=1).committed())


def _last_restored_event(out: Path) -> Restored | None:
    run = RunDirectory(out)
    if not run.events.is_file():
        return None
    last: Restored | None = None
    try:
        for record in AuditTrail.read_history(run):
            if isinstance(record, Restored):
                last = record
    except TrailLineError:
        return None  # the audit at the end names the damaged line
    return last


def _stall_from_history(out: Path) -> float | None:
    """The longest stall of every checkpoint the history records (each commit says it)."""
    run = RunDirectory(out)
    if not run.events.is_file():
        return None
    try:
        stalls = [
            record.stall_us
            for record in AuditTrail.read_history(run)
            if isinstance(record, CheckpointCommitted)
        ]
    except RolloutRecoveryError:
        return None
    return max(stalls) / 1e6 if stalls else None


# ------------------------------------------------------------------------------ the harness


def run_chaos(
    *,
    kills: int,
    seed: int,
    out: Path,
    config_path: Path | None,
    log: Callable[[str], None],
    schedule: Sequence[PlannedKill] | None = None,
    max_final_reruns: int = DEFAULT_MAX_FINAL_RERUNS,
    child_timeout_s: float = 3600.0,
) -> ChaosReport:
    """Kill ``rollout-recovery run`` ``kills`` times, rerun it to the end, audit it.

    ``seed`` seeds the schedule and is passed to the job as ``--seed``. ``out`` must be
    new or empty. ``schedule`` replaces the seeded plan (its length must be ``kills``),
    for tests that need given crash points. ``child_timeout_s`` bounds every child; one
    that runs over is killed and the chaos run fails. Raises ``ConfigError`` for a bad
    config and ``ValueError`` for a bad argument or a non-empty ``out``.
    """
    if kills < 0:
        raise InvalidArgumentError(f"kills must be >= 0, got {kills}", path="$.kills")
    if max_final_reruns < 1:
        raise InvalidArgumentError(
            f"max_final_reruns must be >= 1, got {max_final_reruns}", path="$.max_final_reruns"
        )
    # Loaded here too, so a bad config fails before any child starts, and to size the plan.
    config = load_config(config_path, seed=seed)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InvalidArgumentError(
            f"{out} is not a new or empty directory; chaos needs a fresh run", path="$.out"
        )
    if schedule is None:
        plan = plan_kills(kills, seed, KillRanges.for_config(config))
    else:
        plan = list(schedule)
        if len(plan) != kills:
            raise InvalidArgumentError(
                f"the schedule has {len(plan)} kills, expected {kills}", path="$.schedule"
            )

    started = time.monotonic()
    argv = [sys.executable, "-m", "rollout_recovery", "run", "--out", str(out), "--plain"]
    if config_path is not None:
        argv += ["--config", str(config_path)]
    argv += ["--seed", str(seed)]
    report = ChaosReport(seed=seed, out=out, config_path=config_path, schedule=plan)
    last_output: list[str] = []

    def run_one(planned: PlannedKill | None) -> _Child:
        nonlocal last_output
        armed = None if planned is None else planned.armed
        if planned is not None and planned.point == "journal.before_cut":
            with open(RunDirectory(out).events, "ab") as journal:
                journal.write(TORN_RECORD)
        child = _run_child(
            argv,
            _child_env(armed),
            kill_after_lines=planned.count if planned and planned.point is None else None,
            timeout_s=child_timeout_s,
        )
        report.runs += 1
        last_output = child.lines
        # Its restore's event is the newest one exactly when it got past the restore (the
        # "resumed from" line is logged after the event is written); a later restore may
        # cut it off the trail, so it is read now.
        if any(line.startswith(_RESUMED_PREFIX) for line in child.lines):
            event = _last_restored_event(out)
            if event is not None:
                report.restores += 1
                report.sealed_reused += event.sealed_siblings_kept
                report.sealed_regenerated += event.seals_lost
                report.tokens_reused += event.tokens_reused
                report.tokens_wasted.append(event.tokens_regenerated)
                report.tokens_unsealed.append(event.tokens_in_flight_lost)
                report.replayed_records += event.replayed_records
                report.torn_tails_cut += 1 if event.torn_tail_bytes else 0
                report.cohort_tokens_in_flight_lost.append(event.cohort_tokens_in_flight_lost)
                report.tokens_resumable.append(event.tokens_resumable)
        return child

    total = len(plan)
    for number, planned in enumerate(plan, start=1):
        prefix = f"kill {number}/{total} ({planned.describe()})"
        if report.finished:
            report.outcomes.append(
                KillOutcome(None, planned, "not reached", None, 0.0, "the run had finished")
            )
            log(f"{prefix}: not reached, the run had finished")
            continue
        if planned.point in _RESUME_POINTS and not _has_committed_checkpoint(out):
            # A fresh child never restores: it would run the whole job unkilled.
            report.outcomes.append(
                KillOutcome(None, planned, "not reached", None, 0.0, "nothing to restore yet")
            )
            log(f"{prefix}: not reached, no committed checkpoint to restore yet")
            continue
        child = run_one(planned)
        outcome = _classify(planned, child, report.runs)
        report.outcomes.append(outcome)
        if outcome.result == "not reached":
            report.finished = True
        elif outcome.result == "error":
            report.failures.append(f"run {report.runs} ({planned.describe()}): {outcome.detail}")
        log(f"{prefix}: {outcome.result}, {outcome.detail} [{child.seconds:.1f} s]")

    for _ in range(max_final_reruns):
        if report.finished:
            break
        child = run_one(None)
        if child.timed_out:
            result, detail = "error", f"ran over {child_timeout_s:g} s and was killed"
        elif child.returncode == 0:
            result, detail = "finished", "exit 0"
            report.finished = True
        elif child.returncode == 2:
            # The job refused the directory (another job's run): no rerun can fix that.
            result, detail = "error", f"exit 2: {child.tail()}"
        else:
            result, detail = "failed", f"exit {child.returncode}; rerunning"
        report.outcomes.append(
            KillOutcome(report.runs, None, result, child.returncode, child.seconds, detail)
        )
        log(f"rerun {report.final_reruns}: {result}, {detail} [{child.seconds:.1f} s]")
        if result == "error":
            report.failures.append(f"run {report.runs} (final rerun): {detail}")
            break
    if not report.finished and not report.failures:
        report.failures.append(
            f"the run did not finish within {max_final_reruns} reruns after the last kill"
        )

    if report.finished:
        match = _STALL_RE.search("".join(last_output))
        if match is not None:
            report.longest_checkpoint_stall_s = float(match.group(1))
            report.stall_source = "final run summary"
    if report.longest_checkpoint_stall_s is None and out.is_dir():
        report.longest_checkpoint_stall_s = _stall_from_history(out)
        if report.longest_checkpoint_stall_s is not None:
            report.stall_source = "newest checkpoint's controller state"

    log(f"auditing {out}")
    report.audit = _audit(out)
    report.wall_time_s = time.monotonic() - started
    return report


def _classify(planned: PlannedKill, child: _Child, run: int) -> KillOutcome:
    """Verify one planned kill from how its child ended and what it printed."""

    def outcome(result: str, detail: str) -> KillOutcome:
        return KillOutcome(run, planned, result, child.returncode, child.seconds, detail)

    if child.timed_out:
        return outcome("error", "ran over its time bound and was killed by the watchdog")
    if child.returncode == 0:
        return outcome("not reached", "the run finished first")
    if child.returncode != -signal.SIGKILL:
        return outcome(
            "error", f"exited {child.returncode} instead of dying of SIGKILL:\n{child.tail()}"
        )
    fired = _FIRED_RE.findall("".join(child.lines))
    if planned.point is None:
        if fired or not child.killed_after_lines:
            return outcome(
                "error", f"died of SIGKILL before the harness killed it:\n{child.tail()}"
            )
        return outcome("killed", f"SIGKILL after line {planned.count}")
    if fired != [planned.point]:
        return outcome(
            "error",
            f"died of SIGKILL but did not print 'crash point {planned.point} fired':\n"
            + child.tail(),
        )
    return outcome("killed", f"crash point {planned.point} fired")
