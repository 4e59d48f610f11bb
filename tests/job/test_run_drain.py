"""Graceful drain of ``rollout-recovery run`` (issue 18, item 2), through every trigger.

Each test runs the real CLI in a child process (a pipe, or a pty for Ctrl-C), asks it to
drain once an output line shows training under way, and synchronizes only on its output
lines. Model calls take 0.5 s, so when a step's line is printed the next batches have
just been admitted and are in flight for about a second: the drain has real work to wait
for (its "draining" line says how many attempts, and the tests require some). Every fault
is off, so every seal should train: whatever the rerun generated again was lost.

The rerun must then complete with the audit passing, and when the grace was enough it
regenerates nothing: its ``restored`` record loses no seal and no in-flight token, rolls
back no step, and no attempt is ever abandoned. The reruns are the same command but for
the ``stop`` test's, whose 30 steps are only slack for the stop command's start-up: it
lowers ``job.steps`` to the steps whose prompts were taken (all a restore keeps or
regenerates lies in them; the fresh steps after them would only cost time).
"""

from __future__ import annotations

import contextlib
import errno
import os
import pty
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from rollout_recovery.cli._main import cli
from rollout_recovery.control import RunConfig
from rollout_recovery.history import audit_run
from rollout_recovery.history._trail_reader import read_entries
from rollout_recovery.history.records import (
    AttemptsAbandoned,
    GroupSealed,
    PromptTaken,
    Restored,
    SiblingSealed,
    StepTrained,
)
from rollout_recovery.job import run_job
from rollout_recovery.rundir import RunDirectory

Cli = Callable[..., subprocess.CompletedProcess[str]]

#: Eight steps of 4 prompts x 4 generations, two 0.5 s model calls per attempt, no faults.
DRAIN_JOB: dict[str, dict[str, Any]] = {
    "job": {"steps": 8, "drain_grace_s": 60.0},
    "generation": {"call_latency_s": 0.5, "latency_jitter": 0.0, "attempt_deadline_s": 60.0},
}
STEP_LINE = re.compile(r"^step \d+ \((\d+)/(\d+) done\) ")
DRAINING = re.compile(r"draining \((?P<reason>.*)\): admission stopped; (?P<n>\d+) attempts")
DRAINED = re.compile(
    r"drained \((?P<reason>.*)\) at step (?P<step>\d+): waited (?P<waited>[\d.]+) s of the "
    r"(?P<grace>[\d.]+) s grace for (?P<n>\d+) attempts in flight, (?P<cut>\d+) still "
    r"running at its end; (?P<abandoned>\d+) abandoned"
)
CHILD_TIMEOUT_S = 120.0


def at_step(minimum: int, line: str) -> bool:
    match = STEP_LINE.match(line)
    return match is not None and int(match.group(1)) >= minimum


def once(action: Callable[[], None]) -> Callable[[], None]:
    done: list[bool] = []

    def run() -> None:
        if not done:
            done.append(True)
            action()

    return run


def signal_the_job(out: Path, sig: signal.Signals) -> None:
    pid = RunDirectory(out).lock_holder()
    assert pid is not None
    os.kill(pid, sig)


def records(out: Path) -> list[Any]:
    return [entry.record for entry in read_entries(out / "events.jsonl")]


def seals(items: list[Any]) -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    for record in items:
        if isinstance(record, SiblingSealed):
            found.append((record.group_id, record.seal))
        elif isinstance(record, GroupSealed):
            found.extend((record.group_id, seal) for seal in record.seals)
    return found


def assert_drained(output: str, reason: str) -> re.Match[str]:
    """The job said it drained, for ``reason``, with attempts in flight to wait for."""
    draining = DRAINING.search(output)
    assert draining is not None, output
    assert draining["reason"].startswith(reason), draining["reason"]
    assert int(draining["n"]) > 0, "nothing was in flight: the drain waited for nothing"
    drained = DRAINED.search(output)
    assert drained is not None, output
    assert drained["reason"] == draining["reason"]
    assert "rerun the same command to resume" in output
    return drained


def assert_audit_passes(out: Path, *, complete: bool) -> None:
    report = audit_run(out)
    assert report.ok, "\n".join(report.violations[:20])
    assert report.complete is complete


def steps_taken(out: Path) -> int:
    """How many steps' prompts the run has taken: the fewest ``job.steps`` a resume may
    ask for (every prompt taken is trained; tests/job/test_fewer_steps.py)."""
    return max(r.batch for r in records(out) if isinstance(r, PromptTaken)) + 1


def rerun_regenerates_nothing(out: Path, run_cli: Cli, config: Path | None = None) -> None:
    """The rerun completes, the audit passes, and nothing sealed or in flight was lost.

    ``config``: the rerun's ``--config`` (none: the same command as the first run)."""
    before = len(records(out))
    rerun = run_cli(["--out", str(out), "--plain", *(["--config", str(config)] if config else [])])
    assert rerun.returncode == 0, rerun.stdout
    assert_audit_passes(out, complete=True)
    history = records(out)
    (restored,) = [r for r in history[before:] if isinstance(r, Restored)]
    assert restored.rolled_back_steps == [] and restored.discarded == []
    assert (restored.seals_lost, restored.tokens_lost, restored.tokens_in_flight_lost) == (0, 0, 0)
    assert not [r for r in history if isinstance(r, AttemptsAbandoned)], "work was redone"
    # Every attempt ever sealed trained: not one token was generated twice.
    trained = {row.rollout_id for r in history if isinstance(r, StepTrained) for row in r.rows}
    assert {seal.rollout_id for _, seal in seals(history)} == trained


@pytest.fixture
def drain_job(write_config: Callable[..., Path]) -> Callable[..., Path]:
    def make(**job: Any) -> Path:
        overrides = {**DRAIN_JOB, "job": {**DRAIN_JOB["job"], **job}}
        return write_config(overrides, faults_off=True)

    return make


# ------------------------------------------------------------------------- triggers


@pytest.mark.slow
def test_sigterm_mid_run_drains_exits_0_within_the_grace_and_the_rerun_regenerates_nothing(
    tmp_path: Path, drain_job: Callable[..., Path], run_cli_until: Cli, run_cli: Cli
) -> None:
    out = tmp_path / "run"
    term = once(lambda: signal_the_job(out, signal.SIGTERM))

    def on_line(line: str, lines: list[str]) -> bool:
        if at_step(2, line):
            term()
        return False  # let it end on its own

    args = ["--out", str(out), "--config", str(drain_job()), "--plain"]
    result = run_cli_until(args, stop=on_line)
    assert result.returncode == 0, result.stdout
    drained = assert_drained(result.stdout, "SIGTERM")
    assert (int(drained["cut"]), int(drained["abandoned"])) == (0, 0)
    # Measured on the job's event loop, from the signal to the end of the wait.
    assert float(drained["waited"]) < float(drained["grace"])
    step = int(drained["step"])
    assert 2 <= step < 8
    assert f"drained at step {step} of 8" in result.stdout
    (entry,) = [e for e in RunDirectory(out).read_run_log() if e.event == "drain"]
    assert entry.reason == "SIGTERM" and entry.step == step
    assert_audit_passes(out, complete=False)
    rerun_regenerates_nothing(out, run_cli)


@pytest.mark.slow
def test_the_drain_file_drains_the_run_and_is_removed(
    tmp_path: Path, drain_job: Callable[..., Path], run_cli_until: Cli, run_cli: Cli
) -> None:
    out = tmp_path / "run"
    notice = tmp_path / "preemption-notice"  # an absolute [job] drain_file
    write = once(lambda: notice.write_text("spot instance reclaimed\n"))

    def on_line(line: str, lines: list[str]) -> bool:
        if at_step(2, line):
            write()
        return False

    args = ["--out", str(out), "--config", str(drain_job(drain_file=str(notice))), "--plain"]
    result = run_cli_until(args, stop=on_line)
    assert result.returncode == 0, result.stdout
    drained = assert_drained(result.stdout, f"drain file {notice}: spot instance reclaimed")
    assert int(drained["abandoned"]) == 0
    assert not notice.exists()
    rerun_regenerates_nothing(out, run_cli)


@pytest.mark.slow
def test_rollout_recovery_stop_asks_the_live_job_to_drain_and_waits_for_it(
    tmp_path: Path, drain_job: Callable[..., Path], run_cli_until: Cli, run_cli: Cli
) -> None:
    out = tmp_path / "run"
    stoppers: list[subprocess.Popen[str]] = []

    def start_stop() -> None:
        stoppers.append(
            subprocess.Popen(
                [sys.executable, "-m", "rollout_recovery", "stop", str(out), "--wait"],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )

    stop = once(start_stop)

    def on_line(line: str, lines: list[str]) -> bool:
        if at_step(2, line):
            stop()
        return False

    try:
        # Longer: the stop command's own start-up must not outlast the job.
        args = ["--out", str(out), "--config", str(drain_job(steps=30)), "--plain"]
        result = run_cli_until(args, stop=on_line)
        assert result.returncode == 0, result.stdout
        reason = f"drain file {out / 'DRAIN'}: rollout-recovery stop"
        drained = assert_drained(result.stdout, reason)
        (stopper,) = stoppers
        said, _ = stopper.communicate(timeout=CHILD_TIMEOUT_S)
        assert stopper.returncode == 0, said
        assert "asked the job in" in said and "to drain" in said
        assert f"the job drained at step {drained['step']}" in said
    finally:
        for process in stoppers:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert not (out / "DRAIN").exists()
    # The 30 steps were slack for the stop command's start-up only: the rerun resumes
    # what the drain left and trains just the steps whose prompts were taken (what a
    # restore keeps or regenerates is all there), not the 20-odd fresh steps after them.
    taken = steps_taken(out)
    assert int(drained["step"]) <= taken < 30
    rerun_regenerates_nothing(out, run_cli, drain_job(steps=taken))


def test_stop_without_a_live_job_says_so_and_writes_nothing(
    tmp_path: Path, finished_run: tuple[Path, Any]
) -> None:
    out, _ = finished_run
    result = CliRunner().invoke(cli, ["stop", str(out)])
    assert result.exit_code == 1, result.output
    assert f"no live job holds {out}: nothing to stop" in result.output
    assert not (out / "DRAIN").exists()

    stranger = tmp_path / "not-a-run"
    stranger.mkdir()
    result = CliRunner().invoke(cli, ["stop", str(stranger)])
    assert result.exit_code == 2
    assert "not a rollout-recovery run directory" in result.output
    assert list(stranger.iterdir()) == []


def test_a_stale_drain_file_is_removed_when_the_job_starts(
    finished_run: tuple[Path, Any], run_cli: Cli
) -> None:
    out, _ = finished_run
    (out / "DRAIN").write_text("left by a stop that raced the end of the job\n")
    result = run_cli(["--out", str(out), "--plain"])
    assert result.returncode == 0, result.stdout
    assert "removed a stale drain request" in result.stdout
    assert "drained" not in result.stdout
    assert not (out / "DRAIN").exists()


@pytest.mark.slow
def test_a_grace_too_short_abandons_the_attempts_in_flight_and_still_resumes(
    tmp_path: Path, drain_job: Callable[..., Path], run_cli_until: Cli, run_cli: Cli
) -> None:
    out = tmp_path / "run"
    term = once(lambda: signal_the_job(out, signal.SIGTERM))

    def on_line(line: str, lines: list[str]) -> bool:
        if at_step(2, line):
            term()
        return False

    args = ["--out", str(out), "--config", str(drain_job(drain_grace_s=0.0)), "--plain"]
    result = run_cli_until(args, stop=on_line)
    assert result.returncode == 0, result.stdout
    drained = assert_drained(result.stdout, "SIGTERM")
    abandoned = int(drained["abandoned"])
    assert abandoned > 0
    history = records(out)
    cut = [
        (r.group_id, a.generation_index, a.rollout_id)
        for r in history
        if isinstance(r, AttemptsAbandoned)
        for a in r.attempts
    ]
    reasons = {
        a.reason.value for r in history if isinstance(r, AttemptsAbandoned) for a in r.attempts
    }
    assert reasons == {"drain"} and len(cut) == abandoned
    assert_audit_passes(out, complete=False)

    rerun = run_cli(["--out", str(out), "--plain"])
    assert rerun.returncode == 0, rerun.stdout
    assert_audit_passes(out, complete=True)
    history = records(out)
    (restored,) = [r for r in history if isinstance(r, Restored)]
    assert (restored.seals_lost, restored.tokens_lost) == (0, 0)
    # The abandoned siblings were generated again, with fresh attempts, and trained.
    trained = {
        (row.group_id, row.generation_index): row.rollout_id
        for r in history
        if isinstance(r, StepTrained)
        for row in r.rows
    }
    for group_id, index, rollout_id in cut:
        assert trained[(group_id, index)] != rollout_id


class HandlerProbe:
    """A progress sink that records the SIGTERM handler the process has while it trains."""

    def __init__(self) -> None:
        self.seen: list[object] = []

    def start(self, total_steps: int, resumed_from: int | None) -> None:
        return None

    def update(self, **fields: Any) -> None:
        self.seen.append(signal.getsignal(signal.SIGTERM))

    def log(self, message: str) -> None:
        return None


@pytest.mark.parametrize("drain_on_signals", [True, False])
def test_run_job_puts_the_processs_signal_handlers_back(
    tmp_path: Path, fast_config: Callable[..., RunConfig], drain_on_signals: bool
) -> None:
    def mine(signum: int, frame: object) -> None:
        return None

    previous = signal.signal(signal.SIGTERM, mine)
    probe = HandlerProbe()
    try:
        result = run_job(
            tmp_path / "run",
            fast_config({"job": {"steps": 2}}),
            progress=probe,
            drain_on_signals=drain_on_signals,
        )
        assert result.drained is None
        assert probe.seen  # one look per trained step
        if drain_on_signals:
            assert mine not in probe.seen  # the job's own handler while it ran
        else:
            assert probe.seen == [mine] * len(probe.seen)
        assert signal.getsignal(signal.SIGTERM) is mine
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGTERM, previous)


# ------------------------------------------------------------------ Ctrl-C in a pty


def run_in_pty(args: list[str], on_line: Callable[[str, int], None]) -> tuple[int, str]:
    """``rollout-recovery ARGS`` on a pseudo-terminal: it is the session leader and the
    terminal's foreground process group, so ``\\x03`` written to the master is turned
    into SIGINT by the terminal driver, as Ctrl-C is. ``on_line(line, master)`` sees
    every output line. Returns the exit code and the output."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200")
    pid, master = pty.fork()
    if pid == 0:  # the child: nothing but exec
        try:
            os.execve(sys.executable, [sys.executable, "-m", "rollout_recovery", *args], env)
        finally:
            os._exit(127)
    timed_out = threading.Event()

    def expire() -> None:
        timed_out.set()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)

    watchdog = threading.Timer(CHILD_TIMEOUT_S, expire)
    watchdog.start()
    lines: list[str] = []
    pending = b""
    try:
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError as error:  # EIO: every slave side is closed
                if error.errno != errno.EIO:
                    raise
                break
            if not chunk:
                break
            pending += chunk
            while b"\n" in pending:
                raw, pending = pending.split(b"\n", 1)
                line = raw.decode("utf-8", "replace").rstrip("\r")
                lines.append(line)
                on_line(line, master)
        _, status = os.waitpid(pid, 0)
    finally:
        watchdog.cancel()
        os.close(master)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    output = "\n".join(lines)
    assert not timed_out.is_set(), f"ran over {CHILD_TIMEOUT_S} s:\n{output}"
    return os.waitstatus_to_exitcode(status), output


def ctrl_c(master: int) -> None:
    os.write(master, b"\x03")


@pytest.mark.slow
def test_ctrl_c_in_a_terminal_drains_and_the_rerun_regenerates_nothing(
    tmp_path: Path, drain_job: Callable[..., Path], run_cli: Cli
) -> None:
    out = tmp_path / "run"
    pressed: list[bool] = []

    def on_line(line: str, master: int) -> None:
        if at_step(2, line) and not pressed:
            pressed.append(True)
            ctrl_c(master)

    args = ["run", "--out", str(out), "--config", str(drain_job()), "--plain"]
    code, output = run_in_pty(args, on_line)
    assert code == 0, output
    drained = assert_drained(output, "SIGINT (Ctrl-C)")
    assert int(drained["abandoned"]) == 0
    rerun_regenerates_nothing(out, run_cli)


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once_and_the_run_still_resumes(
    tmp_path: Path, drain_job: Callable[..., Path], run_cli: Cli
) -> None:
    out = tmp_path / "run"
    pressed: list[str] = []

    def on_line(line: str, master: int) -> None:
        if at_step(2, line) and not pressed:
            pressed.append(line)
            ctrl_c(master)
        elif DRAINING.search(line) and len(pressed) == 1:
            pressed.append(line)
            ctrl_c(master)  # while the drain waits for the attempts in flight

    args = ["run", "--out", str(out), "--config", str(drain_job()), "--plain"]
    code, output = run_in_pty(args, on_line)
    assert code == 130, output
    assert len(pressed) == 2
    draining = DRAINING.search(output)
    assert draining is not None and int(draining["n"]) > 0
    assert "interrupted: the second Ctrl-C stops the job now" in output
    assert "stopped without draining" in output
    assert DRAINED.search(output) is None  # no wait, no drain checkpoint
    assert [e.event for e in RunDirectory(out).read_run_log()] == ["start"]

    rerun = run_cli(["--out", str(out), "--plain"])
    assert rerun.returncode == 0, rerun.stdout
    assert_audit_passes(out, complete=True)
    history = records(out)
    (restored,) = [r for r in history if isinstance(r, Restored)]
    # Interrupted: the attempts in flight are abandoned by the restart, and only they.
    restart = {
        a.reason.value for r in history if isinstance(r, AttemptsAbandoned) for a in r.attempts
    }
    assert restart <= {"restart"}
    assert restored.seals_lost == 0
