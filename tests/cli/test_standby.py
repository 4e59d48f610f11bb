"""The warm standby (``[job] standby_within_s``): a rerun after a kill -9 runs in a child of
an interpreter that imported everything before the crash (cli/_standby.py,
cli/_standby_link.py). Real jobs in real processes, SIGKILLed; the fast numpy job (a
torch job's standby imports torch and transformers too, nothing else differs)."""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollout_recovery.cli._standby import Lease, LeaseState, _unfit, _until_closed
from rollout_recovery.cli._standby_link import (
    SOCKET_NAME,
    _Relay,
    code_digest,
    fitness,
    run_out,
    standby_dir,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pidfds")

_RUN = (sys.executable, "-m", "rollout_recovery", "run", "--plain")
# A bound on any wait for a process to do what it was told (a loaded 2-core machine).
_DEADLINE_S = 60.0


def _wait_for(found: Callable[[], Any], what: str) -> Any:
    """Poll ``found`` until it returns something true (a bounded wait for an event the
    test cannot be woken by: a file another process makes)."""
    deadline = time.monotonic() + _DEADLINE_S
    while not (value := found()):
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} after {_DEADLINE_S} s")
        time.sleep(0.02)
    return value


def _gone(pid: int) -> bool:
    """Whether ``pid`` exits within the deadline (a pidfd: woken when it does)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        ready, _, _ = select.select([fd], [], [], _DEADLINE_S)
        return bool(ready)
    finally:
        os.close(fd)


def _standby_pid(out: Path) -> int:
    """The pid listening on the run directory's standby socket, once it listens."""
    path = standby_dir(out) / SOCKET_NAME

    def listener() -> int | None:
        import socket
        import struct

        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as probe:
            try:
                probe.connect(str(path))
            except OSError:
                return None
            raw = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        return int(struct.unpack("3i", raw)[0])

    pid: int = _wait_for(listener, f"standby listening on {path}")
    return pid


class _Job:
    """One ``rollout-recovery run`` in its own process group, output to a file."""

    def __init__(
        self,
        config: Path,
        out: Path,
        log: Path,
        env: dict[str, str] | None,
        prefix: tuple[str, ...] = (),
    ) -> None:
        self.log = log
        environment = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
        environment.pop("ROLLOUT_RECOVERY_CRASH_AT", None)
        environment.update(env or {})
        with open(log, "ab") as handle:
            self.process = subprocess.Popen(
                [*prefix, *_RUN, "--config", str(config), "--out", str(out)],
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=subprocess.STDOUT,
                env=environment,
                start_new_session=True,
            )

    def output(self) -> str:
        return self.log.read_text()

    def wait(self) -> int:
        return self.process.wait(timeout=_DEADLINE_S * 2)

    def kill_group(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[Callable[..., _Job]]:
    started: list[_Job] = []
    counter = iter(range(1000))

    def start(
        config: Path, out: Path, env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()
    ) -> _Job:
        job = _Job(config, out, tmp_path / f"log-{next(counter)}.txt", env, prefix)
        started.append(job)
        return job

    yield start
    for job in started:
        job.kill_group()


@pytest.fixture
def standby_config(tmp_path: Path) -> Callable[..., Path]:
    def write(steps: int = 12, within_s: float = 120.0) -> Path:
        path = tmp_path / f"job-{steps}-{within_s}.toml"
        path.write_text(
            "[job]\n"
            f"steps = {steps}\nprompts_per_step = 4\ngenerations_per_prompt = 4\n"
            f"standby_within_s = {within_s!r}\n"
            "[generation]\ncall_latency_s = 0.02\nattempt_deadline_s = 5.0\n"
            "[faults]\nattempt_failure_rate = 0.0\nstraggler_rate = 0.0\nhang_rate = 0.0\n"
            "capture_failure_rate = 0.0\ntamper_rate = 0.0\nworker_crash_rate = 0.0\n"
            "[checkpoint]\nevery_steps = 2\n"
        )
        return path

    return write


def _standbys_of(out: Path) -> list[int]:
    """The live processes started as the standby of ``out`` (their command line names its
    directory), whether still importing or listening."""
    named = os.fsencode(standby_dir(out))
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if named in (entry / "cmdline").read_bytes().split(b"\0"):
                state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
                if state != "Z":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.fixture(autouse=True)
def _no_standby_left(tmp_path: Path) -> Iterator[None]:
    yield
    left = [pid for out in tmp_path.iterdir() for pid in _standbys_of(out)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"standbys left running: {left}"


def _committed(out: Path) -> bool:
    try:
        text = (out / "events.jsonl").read_text()
    except OSError:
        return False
    return '"event":"checkpoint_committed"' in text.replace(" ", "")


def _killed_with_standby(
    jobs: Callable[..., _Job], config: Path, out: Path, env: dict[str, str] | None = None
) -> int:
    """A first job, SIGKILLed (its group) once its standby listens and a checkpoint has
    committed; the standby's pid. It runs ``config`` with 400 steps: on a loaded machine a
    short job could end before its standby has imported (the reruns' shorter ``steps``
    is an operational change)."""
    first_config = config.with_suffix(".first.toml")
    first_config.write_text(re.sub(r"^steps = \d+$", "steps = 400", config.read_text(), flags=re.M))
    first = jobs(first_config, out, env)
    standby = _standby_pid(out)
    _wait_for(lambda: _committed(out), "checkpoint committed")
    first.kill_group()
    _cover_the_steps_taken(config, out)
    return standby


def _cover_the_steps_taken(config: Path, out: Path) -> None:
    """Raise ``config``'s ``steps`` above the steps the killed job took prompts for: a
    rerun asked for fewer is refused, and how far the first job got before its kill
    depends on the machine's load."""
    batches = re.findall(r'"prompt_taken".*?"batch":(\d+)', (out / "events.jsonl").read_text())
    taken = max(map(int, batches), default=-1) + 1
    text = config.read_text()
    steps = int(re.search(r"^steps = (\d+)$", text, flags=re.M).group(1))  # type: ignore[union-attr]
    if steps <= taken:
        config.write_text(re.sub(r"^steps = \d+$", f"steps = {taken + 2}", text, flags=re.M))


def _audit(out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rollout_recovery", "audit", str(out)],
        capture_output=True,
        text=True,
        timeout=_DEADLINE_S,
    )


def _resumes_in_the_standby_to_its_end(
    jobs: Callable[..., _Job], config: Path, out: Path, standby: int
) -> _Job:
    """A rerun that runs in the standby to its normal end, which ends the standby; the
    run's audit passes."""
    rerun = jobs(config, out)
    assert rerun.wait() == 0, rerun.output()
    assert "running in the warm standby" in rerun.output()
    assert _audit(out).returncode == 0
    assert _gone(standby)
    return rerun


def _handed_over(jobs: Callable[..., _Job], config: Path, out: Path) -> tuple[_Job, int]:
    """A rerun of ``out``, and its job's pid once the standby has forked it."""
    rerun = jobs(config, out)
    child = _wait_for(
        lambda: "(job pid " in rerun.output() and _job_pid(rerun.output()), "hand-over"
    )
    return rerun, child


def _drain_once_started(job: _Job, out: Path) -> None:
    """Ask ``job`` to drain (``rollout-recovery stop``'s drain file) once it has said it
    started or resumed: a drain file found before that is a stale request the job
    removes, and a child just handed over (or a job on a loaded machine) may not be
    there yet."""
    _wait_for(lambda: re.search(r"^(starting|resuming at step) ", job.output(), re.M), "start")
    (out / "DRAIN").write_text("")


def _a_long_rerun_in_the_standby(
    jobs: Callable[..., _Job], standby_config: Callable[..., Path], tmp_path: Path
) -> tuple[Path, Path, int, _Job, int]:
    """A 400-step job killed with its standby, and its rerun handed over: the run
    directory, the config, the standby's pid, the rerun and its job's pid."""
    out = tmp_path / "run"
    config = standby_config(steps=400)
    standby = _killed_with_standby(jobs, config, out)
    rerun, child = _handed_over(jobs, config, out)
    return out, config, standby, rerun, child


def _ctrl_z(rerun: _Job, child: int) -> None:
    """A terminal's Ctrl-Z (SIGTSTP to the foreground group): the job and its rerun stop."""
    os.killpg(rerun.process.pid, signal.SIGTSTP)
    _wait_for(lambda: _state(child) == "T" and _state(rerun.process.pid) == "T", "both stopped")


def _job_pid(output: str) -> int:
    marker = "(job pid "
    line = next(line for line in output.splitlines() if marker in line)
    return int(line.split(marker)[1].split(")")[0])


def test_a_rerun_after_a_kill_runs_in_the_standby_and_its_normal_end_ends_it(
    jobs: Callable[..., _Job], standby_config: Callable[..., Path], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    config = standby_config()
    standby = _killed_with_standby(jobs, config, out)
    rerun = _resumes_in_the_standby_to_its_end(jobs, config, out, standby)
    assert "resum" in rerun.output().lower()
    # The rerun's normal end ended the standby: nothing waits, the directory is gone.
    assert not standby_dir(out).exists()


def test_a_killed_rerun_leaves_no_job_and_the_next_rerun_uses_the_standby_again(
    jobs: Callable[..., _Job], standby_config: Callable[..., Path], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    config = standby_config()
    standby = _killed_with_standby(jobs, config, out)
    rerun, child = _handed_over(jobs, config, out)
    _wait_for(lambda: "resum" in rerun.output().lower(), "resume")
    rerun.kill_group()  # as `rollout-recovery chaos` kills: the rerun's whole group
    assert _gone(child), "the standby's child outlived the rerun that asked for it"
    _resumes_in_the_standby_to_its_end(jobs, config, out, standby)


@pytest.mark.parametrize(
    "point",
    [
        "standby.after_handover",  # the rerun killed: its child must die with it
        "standby.child_started",  # the child killed: the rerun dies of the same signal
    ],
)
def test_a_kill_at_the_hand_over_leaves_no_job_and_the_standby_for_the_next_rerun(
    point: str, jobs: Callable[..., _Job], standby_config: Callable[..., Path], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    config = standby_config()
    standby = _killed_with_standby(jobs, config, out)
    crashed = jobs(config, out, env={"ROLLOUT_RECOVERY_CRASH_AT": point})
    assert crashed.wait() == -signal.SIGKILL, crashed.output()
    assert _gone(_job_pid(crashed.output()))
    # The child was killed, not ended: the standby waits for the next rerun.
    _resumes_in_the_standby_to_its_end(jobs, config, out, standby)


def test_sigterm_to_the_rerun_drains_the_job_in_the_standby(
    jobs: Callable[..., _Job], standby_config: Callable[..., Path], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    config = standby_config(steps=400)
    standby = _killed_with_standby(jobs, config, out)
    rerun = jobs(config, out)
    _wait_for(lambda: "resum" in rerun.output().lower(), "resume")
    rerun.process.send_signal(signal.SIGTERM)
    assert rerun.wait() == 0, rerun.output()
    assert "drained at step" in rerun.output()
    assert _audit(out).returncode == 0
    assert _gone(standby)  # a drain is a normal end


def _ignores(pid: int, signum: int) -> bool:
    """Whether process ``pid`` ignores ``signum`` (its SigIgn mask in /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    raise AssertionError(f"no SigIgn in /proc/{pid}/status")


def test_a_hang_up_the_rerun_ignores_leaves_its_job_in_the_standby_running(
    jobs: Callable[..., _Job], standby_config: Callable[..., Path], tmp_path: Path
) -> None:
    # `nohup rollout-recovery run ...`: a cold job ignores the terminal's hang-up (it
    # handles SIGTERM and SIGINT only), so must the job the standby forked for it: the
    # relayed SIGHUP once killed it, and the rerun with it.
    out = tmp_path / "run"
    config = standby_config(steps=400)
    standby = _killed_with_standby(jobs, config, out)
    rerun = jobs(config, out, prefix=("nohup",))
    _wait_for(lambda: "resum" in rerun.output().lower(), "resume")
    child = _job_pid(rerun.output())
    assert _ignores(child, signal.SIGHUP), "the job does not ignore what its rerun ignores"
    # Standard signals pending together are delivered in the order of their numbers: the
    # hang-up reaches the job before the SIGTERM that drains it.
    rerun.process.send_signal(signal.SIGHUP)
    rerun.process.send_signal(signal.SIGTERM)
    assert rerun.wait() == 0, rerun.output()
    assert "drained at step" in rerun.output()
    assert _audit(out).returncode == 0
    assert _gone(standby)


def test_a_standby_killed_while_its_child_runs_leaves_the_rerun_the_jobs_exit_code(
    jobs: Callable[..., _Job], standby_config: Callable[..., Path], tmp_path: Path
) -> None:
    out, _config, standby, rerun, child = _a_long_rerun_in_the_standby(
        jobs, standby_config, tmp_path
    )
    os.kill(standby, signal.SIGKILL)  # an OOM kill, a stray kill -9: the child lives on
    assert _gone(standby)
    assert not _gone_at_once(child), "the job ended before its standby was killed"
    _drain_once_started(rerun, out)  # a normal end
    assert rerun.wait() == 0, rerun.output()
    assert "exit status was lost" not in rerun.output()
    assert _audit(out).returncode == 0


def test_a_rerun_refused_in_the_standby_leaves_it_for_the_corrected_rerun(
    jobs: Callable[..., _Job], standby_config: Callable[..., Path], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    config = standby_config()
    standby = _killed_with_standby(jobs, config, out)
    too_few = config.with_suffix(".few.toml")
    too_few.write_text(re.sub(r"^steps = \d+$", "steps = 1", config.read_text(), flags=re.M))
    refused = jobs(too_few, out)
    assert refused.wait() == 2, refused.output()
    assert "running in the warm standby" in refused.output()
    assert "job.steps" in refused.output()
    # The run directory's job is still the dead one: the standby waits on.
    _resumes_in_the_standby_to_its_end(jobs, config, out, standby)


def test_ctrl_z_stops_the_job_in_the_standby_and_fg_continues_it(
    jobs: Callable[..., _Job], standby_config: Callable[..., Path], tmp_path: Path
) -> None:
    out, _config, standby, rerun, child = _a_long_rerun_in_the_standby(
        jobs, standby_config, tmp_path
    )
    _ctrl_z(rerun, child)
    os.killpg(rerun.process.pid, signal.SIGCONT)  # fg
    _wait_for(lambda: _state(child) not in ("T", "t"), "the job going on")
    _drain_once_started(rerun, out)
    assert rerun.wait() == 0, rerun.output()
    assert _audit(out).returncode == 0
    assert _gone(standby)


def test_a_stopped_job_dies_with_its_rerun_killed_and_the_next_rerun_uses_the_standby(
    jobs: Callable[..., _Job], standby_config: Callable[..., Path], tmp_path: Path
) -> None:
    # Ctrl-Z, then `kill -9 %1`: a cold job dies, stopped or not. The standby's child is in
    # another process group, and a stopped process runs none of its threads: the one that
    # kills it when its rerun's connection ends cannot. It once stayed stopped for ever,
    # holding the run directory's lock (every later rerun refused, then locked out).
    out, config, standby, rerun, child = _a_long_rerun_in_the_standby(
        jobs, standby_config, tmp_path
    )
    _ctrl_z(rerun, child)
    rerun.kill_group()
    assert _gone(child), "the stopped job outlived the rerun that asked for it"
    config.write_text(re.sub(r"^steps = \d+$", "steps = 40", config.read_text(), flags=re.M))
    _cover_the_steps_taken(config, out)
    _resumes_in_the_standby_to_its_end(jobs, config, out, standby)


def _state(pid: int) -> str:
    """A process's state letter (``T``: stopped), or ``-`` once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return "-"


def _gone_at_once(pid: int) -> bool:
    """Whether ``pid`` has already exited (no wait)."""
    return _state(pid) in ("-", "Z", "X")


def test_a_lapsed_lease_ends_the_standby(
    jobs: Callable[..., _Job], standby_config: Callable[..., Path], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    standby = _killed_with_standby(jobs, standby_config(within_s=0.5), out)
    assert _gone(standby)
    assert not standby_dir(out).exists()


def test_a_changed_environment_is_not_used_and_the_cold_rerun_keeps_its_own(
    jobs: Callable[..., _Job], standby_config: Callable[..., Path], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    config = standby_config(steps=12)
    old = _killed_with_standby(jobs, config, out)
    rerun = jobs(config, out, env={"TRANSFORMERS_VERBOSITY": "error"})
    assert rerun.wait() == 0, rerun.output()
    assert (
        "the warm standby is not used (another environment: TRANSFORMERS_VERBOSITY)"
        in rerun.output()
    )
    assert "running in the warm standby" not in rerun.output()
    assert _gone(old)  # unfit for this directory's reruns: it ended
    assert _audit(out).returncode == 0
    assert not standby_dir(out).exists()  # the cold rerun's own ended with it


def test_a_normal_end_leaves_no_standby(
    jobs: Callable[..., _Job], standby_config: Callable[..., Path], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    job = jobs(standby_config(steps=400), out)
    standby = _standby_pid(out)
    _drain_once_started(job, out)  # a normal end
    assert job.wait() == 0, job.output()
    assert _gone(standby)
    assert not standby_dir(out).exists()


def test_a_job_that_ends_while_its_standby_imports_leaves_none(
    jobs: Callable[..., _Job], standby_config: Callable[..., Path], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    job = jobs(standby_config(steps=400), out)
    standby = _wait_for(lambda: _standbys_of(out), "standby started")[0]
    # A drain ends the job before its standby listens (the job's own imports are fewer).
    (out / "DRAIN").parent.mkdir(exist_ok=True)
    _wait_for(lambda: (out / "job.toml").exists(), "claimed run directory")
    (out / "DRAIN").write_text("")
    assert job.wait() == 0, job.output()
    assert not _standbys_of(out)
    assert _gone(standby)
    assert not standby_dir(out).exists()


def test_a_standby_held_by_a_live_job_is_not_taken(
    jobs: Callable[..., _Job], standby_config: Callable[..., Path], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    config = standby_config(steps=400)
    first = jobs(config, out)
    standby = _standby_pid(out)
    _wait_for(lambda: _committed(out), "checkpoint committed")
    second = jobs(config, out)
    assert second.wait() == 2, second.output()
    assert "not used (a live job holds it)" in second.output()
    assert first.process.poll() is None
    first.kill_group()
    os.kill(standby, signal.SIGTERM)  # its lease would keep it for minutes
    assert _gone(standby)


# --- the parts, without processes -----------------------------------------------------


def test_run_out_takes_only_a_run_with_an_out() -> None:
    assert run_out(["run", "--config", "c.toml", "--out", "d"]) == "d"
    assert run_out(["run", "--out=d", "--plain"]) == "d"
    assert run_out(["run", "--config", "--out", "--plain"]) is None
    assert run_out(["run", "--out", "d", "--print-config"]) is None
    assert run_out(["run", "--out", "d", "--help"]) is None
    assert run_out(["audit", "--out", "d"]) is None
    assert run_out(["run"]) is None


def test_fitness_names_what_changed() -> None:
    mine = fitness({"A": "1", "PWD": "/x"}, ["/p"])
    assert _unfit(mine, fitness({"A": "1", "PWD": "/y", "_": "z"}, ["/p"])) is None
    assert _unfit(mine, fitness({"A": "2"}, ["/p"])) == "another environment: A"
    assert _unfit(mine, fitness({"A": "1"}, ["/q"])) == "another sys.path"
    assert _unfit(mine, {**mine, "code": "0" * 64}) == (
        "the package's source changed since it started"
    )
    assert _unfit(mine, {**mine, "executable": "/other/python"}) == "another python"
    # A rerun from another terminal, ssh session or tmux pane: only the session differs.
    session = {"A": "1", "SSH_TTY": "/dev/pts/9", "TMUX_PANE": "%3", "PS1": "$ ", "TERM": "xterm"}
    assert _unfit(mine, fitness(session, ["/p"])) is None
    # python -O, -X dev or -W error in the rerun: what the standby imported ran without.
    assert _unfit(mine, {**mine, "flags": [*mine["flags"][:1], ["error"], []]}) == (
        "other Python flags (-O, -X, -W)"
    )
    assert _unfit(mine, "nonsense") == "the request is malformed"
    assert mine["code"] == code_digest()


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


_EVENTS = st.lists(
    st.one_of(
        st.just(("died",)),
        st.just(("ended",)),
        st.just(("take",)),
        st.tuples(st.just("advance"), st.floats(0, 10)),
    ),
    max_size=30,
)


@given(lease_s=st.floats(0, 5), events=_EVENTS)
def test_the_lease_follows_its_model(lease_s: float, events: list[tuple[Any, ...]]) -> None:
    clock = _Clock()
    lease = Lease(lease_s, now=clock)
    state, deadline = "held", None
    for event in events:
        if event[0] == "advance":
            clock.now += event[1]
        elif event[0] == "died" and state == "held":
            state, deadline = ("ended", None) if lease_s <= 0 else ("orphaned", clock.now + lease_s)
        elif event[0] == "ended":
            state = "ended"
        elif event[0] == "take":
            expired = state == "orphaned" and deadline is not None and clock.now >= deadline
            if expired:
                state = "ended"
            taken = lease.take()
            assert taken == (state == "orphaned")
            if taken:
                state = "held"
        if event[0] != "take":
            getattr(lease, {"died": "job_died", "ended": "job_ended"}.get(event[0], "wait_s"))()
            lease.wait_s()
            if state == "orphaned" and deadline is not None and clock.now >= deadline:
                state = "ended"
        assert lease.state is LeaseState(state)


def test_a_standby_requests_json_is_plain_data() -> None:
    # What the rerun sends is JSON: nothing in it runs code in the standby.
    assert json.loads(json.dumps(fitness(dict(os.environ), list(sys.path))))


def test_a_standby_killed_as_it_forks_leaves_the_rerun_a_cold_start(
    jobs: Callable[..., _Job], standby_config: Callable[..., Path], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    config = standby_config(steps=12)
    crash_at = {"ROLLOUT_RECOVERY_CRASH_AT": "standby.before_fork"}
    standby = _killed_with_standby(jobs, config, out, env=crash_at)
    rerun = jobs(config, out)
    assert rerun.wait() == 0, rerun.output()
    assert "the warm standby is not used (" in rerun.output()
    assert "running in the warm standby" not in rerun.output()
    assert _gone(standby)
    assert _audit(out).returncode == 0
    # The killed standby's socket was left; the cold rerun's own standby replaced it, and
    # removed it at its normal end.
    assert not standby_dir(out).exists()


def test_changed_source_is_not_used(
    jobs: Callable[..., _Job], standby_config: Callable[..., Path], tmp_path: Path
) -> None:
    # A copy of the package the jobs import from, changed between the kill and the rerun.
    package = Path(__import__("rollout_recovery").__file__).parent
    source = tmp_path / "src"
    shutil.copytree(
        package, source / "rollout_recovery", ignore=shutil.ignore_patterns("__pycache__")
    )
    environment = {"PYTHONPATH": str(source)}
    out = tmp_path / "run"
    config = standby_config(steps=12)
    old = _killed_with_standby(jobs, config, out, env=environment)
    with open(source / "rollout_recovery" / "_cut.py", "a") as changed:
        changed.write("# changed after the standby started\n")
    rerun = jobs(config, out, env=environment)
    assert rerun.wait() == 0, rerun.output()
    assert "not used (the package's source changed since it started)" in rerun.output()
    assert _gone(old)
    assert _audit(out).returncode == 0


def test_stop_drains_the_job_in_the_standby_and_ends_it(
    jobs: Callable[..., _Job], standby_config: Callable[..., Path], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    config = standby_config(steps=400)
    standby = _killed_with_standby(jobs, config, out)
    rerun = jobs(config, out)
    _wait_for(lambda: "resum" in rerun.output().lower(), "resume")
    stop = subprocess.run(
        [sys.executable, "-m", "rollout_recovery", "stop", str(out), "--wait"],
        capture_output=True,
        text=True,
        timeout=_DEADLINE_S,
    )
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert f"(pid {_job_pid(rerun.output())})" in stop.stdout
    assert rerun.wait() == 0, rerun.output()
    assert "drained at step" in rerun.output()
    assert _gone(standby)


def test_a_stop_signal_before_the_child_is_known_reaches_it() -> None:
    # A SIGTERM that comes while the rerun still waits for the standby's answer (a
    # scheduler's, a test's) is kept, and sent to the child once its pidfd is here.
    relay = _Relay()
    try:
        with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) as child:
            os.kill(os.getpid(), signal.SIGTERM)
            assert relay.pending == [signal.SIGTERM]
            relay.to(os.pidfd_open(child.pid))
            assert child.wait(timeout=_DEADLINE_S) == -signal.SIGTERM
    finally:
        relay.pending.clear()
        relay.restore()


def test_a_stop_signal_during_a_refused_hand_over_is_this_processes_again() -> None:
    heard: list[int] = []
    before = signal.signal(signal.SIGHUP, lambda signum, frame: heard.append(signum))
    try:
        relay = _Relay()
        os.kill(os.getpid(), signal.SIGHUP)
        assert heard == [] and relay.pending == [signal.SIGHUP]
        relay.restore()  # the cold path: the handler from before hears it
        assert heard == [signal.SIGHUP]
    finally:
        signal.signal(signal.SIGHUP, before)


@pytest.mark.parametrize("closed", [0, 1])
def test_a_rerun_with_a_closed_standard_descriptor_dies_with_its_job(
    closed: int, jobs: Callable[..., _Job], standby_config: Callable[..., Path], tmp_path: Path
) -> None:
    """A rerun started with stdin (or stdout) closed: its connection to the standby must
    not take that descriptor's number and be handed to the child as its stdin (stdout),
    or the child holds the rerun's own end and never sees the rerun die."""
    out = tmp_path / "run"
    config = standby_config(steps=100_000)  # it does not end by itself within the test
    _killed_with_standby(jobs, config, out)
    log = tmp_path / "closed.txt"
    environment = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    environment.pop("ROLLOUT_RECOVERY_CRASH_AT", None)
    with open(log, "ab") as handle:
        rerun = subprocess.Popen(
            [*_RUN, "--config", str(config), "--out", str(out)],
            stdin=subprocess.DEVNULL,
            stdout=handle if closed != 1 else None,
            stderr=handle,
            env=environment,
            start_new_session=True,
            preexec_fn=lambda: os.close(closed),
        )
    try:

        def handed_over_or_refused() -> str:
            text = log.read_text()
            return text if "(job pid " in text or "not used" in text else ""

        output = _wait_for(handed_over_or_refused, "the hand-over or its refusal")
        child = _job_pid(output) if "(job pid " in output else None
    finally:
        os.killpg(rerun.pid, signal.SIGKILL)
        rerun.wait()
    try:
        if child is not None:  # it ran in the standby: it must have died with the rerun
            survived = not _gone(child)
            if survived:
                os.kill(child, signal.SIGKILL)
            assert not survived, "the job outlived the rerun that was SIGKILLed"
    finally:
        for pid in _standbys_of(out):
            os.kill(pid, signal.SIGTERM)
            assert _gone(pid)


class _ScriptedConnection:
    """A connection whose reads follow a script (a value is returned, an exception
    raised); ``select`` sees it through a pipe that always has a byte to read."""

    def __init__(self, script: list[bytes | BaseException]) -> None:
        self.script = script
        self.reads = 0
        self._read, self._write = os.pipe()
        os.write(self._write, b"x")

    def fileno(self) -> int:
        return self._read

    def recv(self, size: int, flags: int = 0) -> bytes:
        step = self.script[self.reads]
        self.reads += 1
        if isinstance(step, BaseException):
            raise step
        return step

    def close(self) -> None:
        os.close(self._read)
        os.close(self._write)


def test_a_read_that_finds_nothing_is_not_the_reruns_end() -> None:
    # The standby's copy of the rerun's connection shares the descriptor's O_NONBLOCK
    # with the child's: a timeout set on it made the child's "blocking" read fail with
    # EAGAIN, which the child took for its rerun's death and SIGKILLed a healthy job
    # right after the hand-over (two CI runs: "no resume after 60 s").
    connection = _ScriptedConnection([BlockingIOError(), b"noise", InterruptedError(), b""])
    try:
        _until_closed(connection)  # type: ignore[arg-type]
        assert connection.reads == 4, "it stopped before the connection's end"
    finally:
        connection.close()


def test_the_connection_ends_on_the_peers_close_or_a_failure() -> None:
    import socket

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.settimeout(5.0)  # a copy's timeout: the descriptor non-blocking under our object
    theirs.send(b"ping")
    theirs.close()
    _until_closed(ours)
    ours.close()
    failing = _ScriptedConnection([ConnectionResetError()])
    try:
        _until_closed(failing)  # type: ignore[arg-type]
        assert failing.reads == 1
    finally:
        failing.close()


@pytest.mark.parametrize("ignored", [None, "1", [1, "2"], [True]])
def test_a_request_whose_ignored_signals_are_malformed_is_refused(ignored: object) -> None:
    import socket

    from rollout_recovery.cli._standby import _Standby

    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as listener:
        standby = _Standby(listener, Lease(10.0), None, {}, {})
        why = standby._refusal({"ignored": ignored}, [0, 1, 2])
    assert why is not None and "ignored" in why


def test_the_forked_job_ignores_the_reruns_ignored_signals_and_no_others() -> None:
    # In a process of its own: the dispositions are the process's. The standby's came
    # from the first job (SIGUSR1 ignored there); the rerun ignores SIGHUP and SIGINT.
    script = """if True:
        import signal
        from rollout_recovery.cli._standby import _take_signals
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        mine = lambda signum, frame: None
        signal.signal(signal.SIGUSR2, mine)
        _take_signals({int(signal.SIGHUP), int(signal.SIGINT), int(signal.SIGPIPE)})
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGPIPE) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
        assert signal.getsignal(signal.SIGUSR2) is mine
        _take_signals(set())
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL
    """
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=_DEADLINE_S
    )
    assert done.returncode == 0, done.stderr


# A standby (its handlers: ``serve``'s) forks a child for a rerun; ``argv[1]`` reaches the
# child at ``argv[2]``: "fork" (as it starts dropping the standby's handlers: a group's
# kill, a ``pkill``) or "relay" (once it sent the rerun its pidfd: the rerun's relay of a
# signal that came during the exchange). ``argv[3:]``: the signals the rerun ignores.
# The child runs a stand-in for the command; the standby prints its exit status and its
# signal mask after the fork.
_A_SIGNAL_AS_THE_STANDBY_FORKS = """if True:
    import json, os, signal, socket, sys
    from rollout_recovery.cli import _standby
    from rollout_recovery.cli._standby import Lease, _Standby, run_forked_command

    signum, where, ignored = int(sys.argv[1]), sys.argv[2], [int(s) for s in sys.argv[3:]]
    stop = []
    for standby_signal in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(standby_signal, lambda n, frame: stop.append(n))
    standby_pid = os.getpid()
    leave, send_fds = _Standby._leave, socket.send_fds

    def arrives_as_it_leaves(self):
        os.kill(os.getpid(), signum)
        leave(self)

    def arrives_once_it_is_known(*args, **kwargs):
        sent = send_fds(*args, **kwargs)
        if os.getpid() != standby_pid:
            os.kill(os.getpid(), signum)
        return sent

    if where == "fork":
        _Standby._leave = arrives_as_it_leaves
    else:
        socket.send_fds = arrives_once_it_is_known
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    standby = _Standby(listener, Lease(10.0), None, {}, {})
    rerun, connection = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    request = {"cwd": os.getcwd(), "umask": 0o022, "ignored": ignored}
    forked = standby._fork(connection, request, [os.dup(0), os.dup(1), os.dup(2)])
    if forked is not None:  # the child
        run_forked_command(lambda argv, name: print("the job ran", flush=True))
        sys.exit(0)
    (child,) = standby.children
    _pid, status = os.waitpid(child, 0)
    mask = sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))
    print(json.dumps({"status": status, "mask": mask}), flush=True)
"""


def _a_signal_as_the_standby_forks(
    signum: int, where: str, ignored: tuple[int, ...] = ()
) -> tuple[int, str, str]:
    """The child's exit code (negative: the signal that killed it), its stdout, stderr."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _A_SIGNAL_AS_THE_STANDBY_FORKS,
            str(signum),
            where,
            *map(str, ignored),
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=_DEADLINE_S,
    )
    assert done.returncode == 0, done.stderr
    told = json.loads(done.stdout.splitlines()[-1])
    assert told["mask"] == [], "the standby kept signals blocked after the fork"
    return os.waitstatus_to_exitcode(told["status"]), done.stdout, done.stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_that_reaches_the_child_as_it_is_forked_ends_the_job(signum: int) -> None:
    # It once ran the standby's handler, still the child's: the job ran on as if nothing
    # had asked it to stop.
    code, out, _err = _a_signal_as_the_standby_forks(signum, "fork")
    assert code == -signum, out
    assert "the job ran" not in out


@pytest.mark.parametrize("where", ["fork", "relay"])
def test_a_ctrl_c_as_the_child_is_forked_or_relayed_to_it_ends_the_job_and_says_so(
    where: str,
) -> None:
    # As it is forked: the standby's handler lost it. Relayed at once after the hand-over
    # (a Ctrl-C during the exchange): it raised KeyboardInterrupt in the hand-over, which
    # exited 70 without a word. Now the job dies of it before it starts, as a cold one
    # Ctrl-C'd in its imports.
    code, out, err = _a_signal_as_the_standby_forks(signal.SIGINT, where)
    assert code == -signal.SIGINT, (out, err)
    assert "Traceback" not in err
    assert "interrupted (Ctrl-C)" in err
    assert "the job ran" not in out


def test_a_hang_up_the_rerun_ignores_that_comes_as_the_child_is_forked_is_ignored() -> None:
    code, out, _err = _a_signal_as_the_standby_forks(
        signal.SIGHUP, "fork", ignored=(signal.SIGHUP,)
    )
    assert code == 0 and "the job ran" in out


def test_sigquit_to_the_rerun_is_relayed_to_its_job(tmp_path: Path) -> None:
    # Ctrl-\ kills a cold job (SIGQUIT, a core where the limits allow); the standby's
    # child is in no terminal's group, and SIGQUIT was not relayed: the rerun died of it
    # (its own core, of the relay), the job of SIGKILL as the rerun's connection ended
    # (no core of the job). In a process of its own: unrelayed, the SIGQUIT kills the
    # process that sends it.
    script = """if True:
        import os, signal, subprocess, sys
        from rollout_recovery.cli._standby_link import _Relay
        relay = _Relay()
        # It ends with this process (its stdin's end) if the SIGQUIT is not relayed.
        with subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
        ) as job:
            relay.to(os.pidfd_open(job.pid))
            os.kill(os.getpid(), signal.SIGQUIT)
            print(job.wait(timeout=60), flush=True)
    """
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=_DEADLINE_S,
    )
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert int(done.stdout) == -signal.SIGQUIT


def test_a_rerun_whose_job_dumped_core_dies_of_the_signal_without_a_core_of_its_own(
    tmp_path: Path,
) -> None:
    # The job's core (SIGQUIT, SIGSEGV, SIGABRT) is the child's; the rerun re-raises the
    # signal and once dumped a second core, of the relay, where the limits allowed one.
    import resource

    _soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    if hard == 0:
        pytest.skip("no core can be dumped here (hard RLIMIT_CORE 0)")
    script = """if True:
        import resource, signal, socket
        from rollout_recovery.cli._standby_link import _wait
        _soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
        resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))  # a core where one can be
        ours, standby = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        standby.send(f"exit {int(signal.SIGQUIT) | 0x80}".encode())  # killed, core dumped
        _wait(ours)
    """
    rerun = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path)
    _pid, status = os.waitpid(rerun.pid, 0)
    rerun.returncode = os.waitstatus_to_exitcode(status)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGQUIT, status
    assert not os.WCOREDUMP(status), "the rerun dumped a core of its own"
