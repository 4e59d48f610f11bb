"""Warm vLLM servers survive a controller crash (issue 28 item 4).

A launched server outlives a job that died without a normal end for ``[vllm]
adopt_within_s`` (its guard's lease, ``_guard.py``); the rerun adopts the listed servers
it proves it launched (``_adoption.py``), hands their leases over to itself, and starts
only the missing ones. The jobs here are real subprocesses killed with SIGKILL; the
servers are ``fake_vllm_server.py`` (``test_vllm_fleet.py``), each a group of two
processes, one of which ignores SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from process_support import alive, ready_job
from test_vllm_fleet import DEADLINE_S, JOB, _config, _records, _wait_until, fake_dir  # noqa: F401

from rollout_recovery._crashpoints import CRASH_AT_ENV
from rollout_recovery.control import load_config
from rollout_recovery.control._config import config_from_builtins
from rollout_recovery.errors import ConfigError
from rollout_recovery.job._components import generation_servers, server_api_key
from rollout_recovery.rundir import RunDirectory
from rollout_recovery.vllm import VllmConfig, _guard
from rollout_recovery.vllm._fleet import VllmFleet
from rollout_recovery.vllm._guard import Lease, LeaseState

# Every test has the fleet tests' fake servers record themselves (and be killed after).
pytestmark = pytest.mark.usefixtures("fake_dir")

#: A lease no test outlives: servers in these tests end by being adopted and closed.
LONG_LEASE_S = 600.0


# -- the lease, on a clock the test moves -----------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_lease_orphans_on_the_jobs_death_and_ends_at_its_deadline() -> None:
    clock = _Clock()
    lease = Lease(10.0, clock)
    assert lease.state is LeaseState.HELD and lease.wait_s() is None
    clock.now = 100.0  # time while held never counts
    lease.job_died()
    assert lease.state is LeaseState.ORPHANED and lease.wait_s() == 10.0
    clock.now = 109.5
    assert lease.wait_s() == pytest.approx(0.5) and not lease.ended
    clock.now = 110.0
    assert lease.wait_s() == 0.0 and lease.ended
    assert not lease.adopted(10.0)  # too late: it has ended


def test_an_adopted_lease_is_held_again_with_the_new_jobs_lease() -> None:
    clock = _Clock()
    lease = Lease(10.0, clock)
    lease.job_died()
    clock.now = 9.0
    assert lease.adopted(3.0)
    assert lease.state is LeaseState.HELD and lease.wait_s() is None
    clock.now = 50.0
    lease.job_died()  # the new job dies: its own lease starts now
    clock.now = 52.9
    assert lease.wait_s() == pytest.approx(0.1)
    clock.now = 53.0
    lease.wait_s()
    assert lease.ended


def test_a_lease_held_by_a_live_job_is_no_other_jobs_to_adopt_or_end() -> None:
    lease = Lease(10.0, _Clock())
    assert not lease.claimable(by_holder=False) and not lease.adopted(10.0)
    assert lease.state is LeaseState.HELD
    assert lease.adopted(3.0, by_holder=True) and lease.lease_s == 3.0
    lease.job_died()
    assert lease.claimable(by_holder=False) and lease.adopted(10.0)


def test_a_lease_is_not_adopted_once_its_deadline_passed_even_if_nothing_noticed() -> None:
    """The guard may wake for the request only after the deadline (a late select)."""
    clock = _Clock()
    lease = Lease(10.0, clock)
    lease.job_died()
    clock.now = 10.0  # nothing asked wait_s since
    assert not lease.adopted(10.0) and lease.ended


def test_a_lease_of_zero_ends_with_the_job() -> None:
    lease = Lease(0.0, _Clock())
    lease.job_died()
    assert lease.ended


class LeaseMachine(RuleBasedStateMachine):
    """Against a model: the group lives while a job holds it, or, after the last holder
    died, until that holder's lease has run; never after a stop."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = _Clock()
        self.lease_s = 5.0
        self.lease = Lease(self.lease_s, self.clock)
        self.held = True
        self.died_at: float | None = None
        self.stopped = False

    def _model_ended(self) -> bool:
        if self.stopped:
            return True
        if self.held or self.died_at is None:
            return False
        return self.lease_s <= 0 or self.clock.now >= self.died_at + self.lease_s

    @rule(seconds=st.floats(min_value=0.0, max_value=8.0))
    def time_passes(self, seconds: float) -> None:
        self.clock.now += seconds
        self.lease.wait_s()  # the guard's loop asks after every wake

    @rule()
    def the_job_dies(self) -> None:
        self.lease.job_died()
        if self.held and not self._model_ended():
            self.held, self.died_at = False, self.clock.now

    @rule(lease_s=st.sampled_from([0.0, 1.0, 5.0]), by_holder=st.booleans())
    def a_rerun_adopts(self, lease_s: float, by_holder: bool) -> None:
        took = self.lease.adopted(lease_s, by_holder)
        # A live job's server is only its own to hand over.
        assert took == (not self._model_ended() and (by_holder or not self.held))
        if took:
            self.held, self.died_at, self.lease_s = True, None, lease_s

    @precondition(lambda self: not self.stopped)
    @rule()
    def stopped_or_server_exited(self) -> None:
        self.lease.end()
        self.stopped = True

    @invariant()
    def ends_exactly_when_the_model_does(self) -> None:
        self.lease.wait_s()
        assert self.lease.ended == self._model_ended()
        wait = self.lease.wait_s()
        if wait is not None and not self.lease.ended:
            assert self.died_at is not None
            assert wait == pytest.approx(self.died_at + self.lease_s - self.clock.now)


LeaseMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
TestLease = LeaseMachine.TestCase


# -- real jobs, SIGKILLed ----------------------------------------------------------------


def _encoded(config: VllmConfig) -> str:
    return msgspec.json.encode(config).decode()


def _listing(run: Path) -> list[dict[str, object]]:
    servers: list[dict[str, object]] = json.loads((run / "servers.json").read_text())["servers"]
    return servers


def _group(record: dict[str, object]) -> list[int]:
    return [int(record["pid"]), int(record["child"])]  # type: ignore[call-overload]


def _fake_dir() -> Path:
    """Where the fake servers record themselves (the ``fake_dir`` fixture's)."""
    return Path(os.environ["FAKE_VLLM_DIR"])


def _all_processes(recorded: Path) -> list[int]:
    return [pid for record in _records(recorded) for pid in _group(record)]


#: The groups of the servers the jobs of the running test launched, killed after it: a
#: test that fails may leave them on a long lease, and a later server of the same name
#: replaces their record, so the ``fake_dir`` fixture cannot name them.
_LAUNCHED: list[int] = []
#: Their socket directories, which a SIGKILLed guard cannot remove.
_SOCKET_DIRS: list[Path] = []


@pytest.fixture(autouse=True)
def _kill_launched_groups() -> Iterator[None]:
    yield
    while _LAUNCHED:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(_LAUNCHED.pop(), signal.SIGKILL)
    while _SOCKET_DIRS:
        shutil.rmtree(_SOCKET_DIRS.pop(), ignore_errors=True)


def _rerun(run: Path, config: VllmConfig) -> tuple[VllmFleet, list[str]]:
    """The fleet of a rerun on ``run`` (in this process), and what it logs."""
    heard: list[str] = []
    fleet = VllmFleet(
        run / "servers", run / "servers.json", config, served_model_name="m", log=heard.append
    )
    return fleet, heard


def _start_and_kill(config: VllmConfig, run: Path) -> list[int]:
    """Run a job that starts the fleet, SIGKILL it once its servers are ready; returns
    the listed guards' pids."""
    with ready_job(JOB, _encoded(config), str(run)) as job:
        guards = [int(listed["pid"]) for listed in _listing(run)]  # type: ignore[call-overload]
        _LAUNCHED.extend(guards)
        _SOCKET_DIRS.extend(Path(str(listed["socket"])).parent for listed in _listing(run))
        os.kill(job.pid, signal.SIGKILL)
        job.wait()
    return guards


def test_a_server_of_a_sigkilled_job_ends_by_itself_when_its_lease_lapses(tmp_path: Path) -> None:
    recorded = _fake_dir()
    config = _config(tmp_path, launch=1, adopt_within_s=1.0)
    run = tmp_path / "run"
    _start_and_kill(config, run)
    processes = _all_processes(recorded)
    sockets = Path(str(_listing(run)[0]["socket"])).parent
    _wait_until(lambda: not any(alive(pid) for pid in processes), "the lease lapsed")
    assert list(recorded.glob("*.terminated"))  # shut down, not only killed
    _wait_until(lambda: not sockets.exists(), "the socket directory was removed")


def test_a_rerun_adopts_the_live_servers_and_a_normal_end_stops_them_at_once(
    tmp_path: Path,
) -> None:
    recorded = _fake_dir()
    config = _config(tmp_path, launch=2, adopt_within_s=LONG_LEASE_S)
    run = tmp_path / "run"
    guards = _start_and_kill(config, run)
    old_key = _records(recorded)[0]["env"]["VLLM_API_KEY"]  # type: ignore[index]
    processes = _all_processes(recorded)
    fleet, heard = _rerun(run, config)
    with fleet:
        urls = fleet.start()
        assert [server.pid for server in fleet.servers] == guards  # the same guards
        assert all(server.adopted for server in fleet.servers)
        assert len(_records(recorded)) == 2  # nothing new started
        assert fleet.api_key == old_key  # the servers require the key they started with
        assert [listed["url"] for listed in _listing(run)] == urls
        assert [line for line in heard if " adopted " in line] == [
            f"vLLM server {i} adopted from the job before at {urls[i]}" for i in range(2)
        ]
        assert all(alive(pid) for pid in processes)
    # Closed: ended at once, not at the end of the lease.
    assert len(list(recorded.glob("*.terminated"))) == 2
    _wait_until(lambda: not any(alive(pid) for pid in processes), "the servers ended")
    # After a normal end nothing is left to adopt, and the next start says nothing of it.
    fleet, heard = _rerun(run, config)
    with fleet:
        fleet.start()
    assert not [line for line in heard if "of the job before" in line]


def test_adopted_servers_are_watched_for_the_new_jobs_death(tmp_path: Path) -> None:
    """The lease is handed over: the rerun (a job too, SIGKILLed) holds the servers for
    as long as it lives, however short its lease (0.5 s), and they end its own lease
    after its death, not the first job's (600 s)."""
    recorded = _fake_dir()
    run = tmp_path / "run"
    _start_and_kill(_config(tmp_path, launch=1, adopt_within_s=LONG_LEASE_S), run)
    processes = _all_processes(recorded)
    config = _config(tmp_path, launch=1, adopt_within_s=0.5)
    with ready_job(JOB, _encoded(config), str(run)) as rerun:
        assert len(_records(recorded)) == 1  # the rerun adopted the server, started none
        # Something that must not happen: a window of several leases, in which a guard
        # that did not watch the rerun would have ended the server. A slow machine only
        # makes such a guard slower, so this cannot fail spuriously.
        time.sleep(5 * config.adopt_within_s)
        assert all(alive(pid) for pid in processes)
        os.kill(rerun.pid, signal.SIGKILL)
        rerun.wait()
    _wait_until(lambda: not any(alive(pid) for pid in processes), "the new lease lapsed")


def test_the_rerun_starts_only_the_missing_servers(tmp_path: Path) -> None:
    recorded = _fake_dir()
    run = tmp_path / "run"
    _start_and_kill(_config(tmp_path, launch=1, adopt_within_s=LONG_LEASE_S), run)
    config = _config(tmp_path, launch=2, adopt_within_s=LONG_LEASE_S)
    listed_at_start: list[list[int]] = []

    def heard(line: str) -> None:
        if line.startswith("starting "):  # once every new server's guard is spawned
            listed_at_start.append([int(str(entry["pid"])) for entry in _listing(run)])

    with VllmFleet(
        run / "servers", run / "servers.json", config, served_model_name="m", log=heard
    ) as fleet:
        fleet.start()
        assert [server.adopted for server in fleet.servers] == [True, False]
        # Listed before it was ready: a rerun after a kill now would know its guard.
        assert listed_at_start == [[server.pid for server in fleet.servers]]
        new = _records(recorded)[-1]
        assert new["env"]["VLLM_API_KEY"] == fleet.api_key  # type: ignore[index]
        adopted_dir, new_dir = (Path(str(listed["socket"])).parent for listed in _listing(run))
        # A new server never starts where a guard of the job before may own the path.
        assert new_dir != adopted_dir and stat.S_IMODE(new_dir.stat().st_mode) == 0o700
        processes = _all_processes(recorded)
    _wait_until(lambda: not any(alive(pid) for pid in processes), "the servers ended")
    _wait_until(lambda: not adopted_dir.exists(), "the adopted server's guard removed its dir")
    assert not new_dir.exists()


def test_a_changed_vllm_config_is_not_adopted_the_old_server_ends_a_new_one_starts(
    tmp_path: Path,
) -> None:
    recorded = _fake_dir()
    run = tmp_path / "run"
    _start_and_kill(_config(tmp_path, launch=1, adopt_within_s=LONG_LEASE_S), run)
    old = _all_processes(recorded)
    changed = _config(tmp_path, launch=1, adopt_within_s=LONG_LEASE_S, max_num_seqs=3)
    fleet, heard = _rerun(run, changed)
    with fleet:
        fleet.start()
        assert not fleet.servers[0].adopted
        # Ended before the new one started (its guard has exited; what it SIGKILLed last
        # may take a moment to go).
        _wait_until(lambda: not any(alive(pid) for pid in old), "the old server ended")
        assert (recorded / "vllm-0.terminated").exists()
        assert any("it runs another command" in line for line in heard)
        new = _records(recorded)[0]
        assert new["argv"][new["argv"].index("--max-num-seqs") + 1] == "3"  # type: ignore[index,union-attr]


def test_a_server_whose_socket_directory_is_no_longer_private_is_left_alone(tmp_path: Path) -> None:
    """Nothing proves it is ours: no signal goes to it (its guard's lease ends it), and
    a new server starts in a new private directory."""
    recorded = _fake_dir()
    run = tmp_path / "run"
    _start_and_kill(_config(tmp_path, launch=1, adopt_within_s=LONG_LEASE_S), run)
    old = _all_processes(recorded)
    sockets = Path(str(_listing(run)[0]["socket"])).parent
    sockets.chmod(0o755)
    config = _config(tmp_path, launch=1, adopt_within_s=LONG_LEASE_S)
    fleet, heard = _rerun(run, config)
    with fleet:
        fleet.start()
        assert not fleet.servers[0].adopted
        assert fleet.servers[0].socket.parent != sockets
        assert stat.S_IMODE(fleet.servers[0].socket.parent.stat().st_mode) == 0o700
        assert any("not private to this user" in line for line in heard)
    assert all(alive(pid) for pid in old)  # left alone (killed after the test)


def test_a_run_on_a_copy_of_a_live_runs_directory_leaves_its_servers_alone(
    tmp_path: Path,
) -> None:
    """The copy's ``servers.json`` lists the live run's servers: its guards refuse them to
    the copy (to adopt as to end), which starts its own and never signals theirs."""
    recorded = _fake_dir()
    run, copy = tmp_path / "run", tmp_path / "copy"
    config = _config(tmp_path, launch=1, adopt_within_s=LONG_LEASE_S)
    with ready_job(JOB, _encoded(config), str(run)) as job:
        _LAUNCHED.extend(int(listed["pid"]) for listed in _listing(run))  # type: ignore[call-overload]
        live = _all_processes(recorded)
        shutil.copytree(run, copy)
        fleet, heard = _rerun(copy, config)
        with fleet:
            fleet.start()
            assert not fleet.servers[0].adopted
            assert any("a live job holds it" in line for line in heard), heard
        assert all(alive(pid) for pid in live) and job.poll() is None


def test_adoption_off_ends_the_servers_of_the_job_before(tmp_path: Path) -> None:
    recorded = _fake_dir()
    run = tmp_path / "run"
    _start_and_kill(_config(tmp_path, launch=1, adopt_within_s=LONG_LEASE_S), run)
    old = _all_processes(recorded)
    config = _config(tmp_path, launch=1, adopt_within_s=0.0)
    with VllmFleet(run / "servers", run / "servers.json", config, served_model_name="m") as fleet:
        fleet.start()
        assert not fleet.servers[0].adopted
        _wait_until(lambda: not any(alive(pid) for pid in old), "the old server ended")


CRASHING_RERUN = JOB


def test_a_kill_between_proof_and_hand_over_leaves_the_server_to_the_next_rerun(
    tmp_path: Path,
) -> None:
    """kill -9 at ``adopt.before_handover``: the server was proven but never handed over,
    so it is still the dead first job's, on that job's lease; the next rerun adopts it,
    and a short lease then ends it by itself."""
    recorded = _fake_dir()
    run = tmp_path / "run"
    _start_and_kill(_config(tmp_path, launch=1, adopt_within_s=LONG_LEASE_S), run)
    processes = _all_processes(recorded)
    config = _config(tmp_path, launch=1, adopt_within_s=1.0)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(sys.path),
        CRASH_AT_ENV: "adopt.before_handover",
    }
    crashed = subprocess.run(
        [sys.executable, "-c", CRASHING_RERUN, _encoded(config), str(run)],
        env=env,
        capture_output=True,
        timeout=DEADLINE_S,
    )
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert b"crash point adopt.before_handover fired" in crashed.stderr
    assert all(alive(pid) for pid in processes) and len(_records(recorded)) == 1
    _start_and_kill(config, run)  # adopts it (nothing new starts), then dies
    assert len(_records(recorded)) == 1
    _wait_until(lambda: not any(alive(pid) for pid in processes), "the lease lapsed")


# -- the job presents the adopted servers' key ----------------------------------------------

ADOPTING_JOB = (
    '[trainer]\nkind = "torch"\n[task]\nkind = "emit_token"\n'
    '[generation]\nbackend = "http"\n[http]\nweight_sync = "vllm"\nmodel = "m"\n'
    '[model]\nsource = "{model}"\n'
    '[vllm]\nlaunch = 1\npython = "{python}"\nmodel = "{model}"\nadopt_within_s = 600.0\n'
)


def test_the_job_presents_the_key_its_adopted_servers_were_started_with(
    tmp_path: Path,
) -> None:
    """A rerun's backend sends the adopted servers' key, not a new random one (which the
    servers would refuse with 401 on every call)."""
    recorded = _fake_dir()
    run = tmp_path / "run"
    fleet_config = _config(tmp_path, launch=1, adopt_within_s=LONG_LEASE_S)
    _start_and_kill(fleet_config, run)
    old_key = _records(recorded)[0]["env"]["VLLM_API_KEY"]  # type: ignore[index]
    path = tmp_path / "job.toml"
    path.write_text(ADOPTING_JOB.format(model=fleet_config.model, python=fleet_config.python))
    config = load_config(path)
    with generation_servers(RunDirectory(run), config) as resolved:
        assert len(_records(recorded)) == 1  # adopted, nothing started
        assert server_api_key(resolved) == old_key


def test_another_kv_cache_size_is_not_adopted(tmp_path: Path) -> None:
    """The environment is what the guard really runs with (``/proc``), not what a file
    says: a server started with another KV cache is ended and started again."""
    recorded = _fake_dir()
    run = tmp_path / "run"
    _start_and_kill(_config(tmp_path, launch=1, adopt_within_s=LONG_LEASE_S), run)
    old = _all_processes(recorded)
    fleet, heard = _rerun(
        run, _config(tmp_path, launch=1, adopt_within_s=LONG_LEASE_S, kv_cache_gib=2)
    )
    with fleet:
        fleet.start()
        assert not fleet.servers[0].adopted
        assert any("another vLLM environment" in line for line in heard)
        _wait_until(lambda: not any(alive(pid) for pid in old), "the old server ended")


# -- the guard itself, on its control socket ----------------------------------------------

GUARD = Path(_guard.__file__)
#: The guarded "server": a process that waits to be ended.
SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]
#: One listening on the socket it is given, then writing its pid to the file given.
SERVING = [
    sys.executable,
    "-c",
    "import os, socket, sys, time; s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); "
    "s.listen(); open(sys.argv[2], 'w').write(str(os.getpid())); time.sleep(600)",
]


def _server_pid(control: Path) -> str:
    """The pid the server of :func:`_guard_of` wrote once it listened ('' until then)."""
    with contextlib.suppress(OSError):
        return Path(f"{control.parent}.pid").read_text()
    return ""


#: The guard, whose loop's first long wait raises once its server listens (an error
#: nobody foresaw: it must still end the group).
FAILING_GUARD = """
import os, runpy, select, sys
real = select.select
def failing(r, w, x, timeout=None):
    if timeout != 0 and os.path.exists(os.path.dirname(sys.argv[-2]) + ".pid"):
        raise OSError("a failure nobody foresaw")
    return real(r, w, x, 1.0 if timeout is None else min(timeout, 1.0))
select.select = failing
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@contextlib.contextmanager
def _guard_of(
    *, lease_s: float = LONG_LEASE_S, serving: bool = False, failing: bool = False
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A guard (leading its own group) of a server that waits to be ended (``serving``:
    listening on the guard's server socket, ``vllm-0.sock``), held by this process; yields
    it and its control socket, in a short private directory (a socket path has ~100
    bytes). ``failing``: its loop's wait raises once the server runs."""
    sockets = Path(tempfile.mkdtemp(prefix="rr-guard-"))
    control, server = sockets / "vllm-0.guard", sockets / "vllm-0.sock"
    command = [*SERVING, str(server), f"{sockets}.pid"] if serving else SLEEPER
    runner = [str(GUARD)] if not failing else ["-c", FAILING_GUARD, str(GUARD)]
    guard = subprocess.Popen(
        [
            *(sys.executable, *runner, "--parent-pid", str(os.getpid())),
            *("--socket", str(server), "--lease-s", repr(lease_s)),
            *("--control", str(control), "--", *command),
        ],
        start_new_session=True,
    )
    try:
        # Not the socket file's existence: the guard binds it before it listens, and a
        # connect between the two is refused (a loaded CI run asked in that gap).
        _wait_until(lambda: _listens(control) or guard.poll() is not None, "the guard listens")
        yield guard, control
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(guard.pid, signal.SIGKILL)
        guard.wait()
        shutil.rmtree(sockets, ignore_errors=True)
        Path(f"{sockets}.pid").unlink(missing_ok=True)


def _ask_from_another_process(control: Path, request: str) -> str:
    """What the guard answers ``request`` sent by a process other than its job's."""
    asking = (
        "import socket, sys; c = socket.socket(socket.AF_UNIX); c.connect(sys.argv[1]); "
        "c.sendall(sys.argv[2].encode() + b'\\n'); print(c.recv(64).decode().strip())"
    )
    done = subprocess.run(
        [sys.executable, "-c", asking, str(control), request],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    return done.stdout.strip()


def _listens(control: Path) -> bool:
    """The guard answers ``hello`` on its control socket (a request that changes nothing)."""
    try:
        return _ask_from_here(control, "hello").startswith("guard ")
    except (FileNotFoundError, ConnectionRefusedError):
        return False


def _ask_from_here(control: Path, request: str) -> str:
    with socket.socket(socket.AF_UNIX) as connection:
        connection.settimeout(DEADLINE_S)
        connection.connect(str(control))
        connection.sendall(f"{request}\n".encode())
        return connection.recv(64).decode().strip()


def test_a_guard_gives_a_live_jobs_server_to_no_other_process() -> None:
    """A run on a copy of the run directory lists the live run's servers: its ``adopt``
    and ``end`` are refused while the job holding them lives; the holder's are not."""
    with _guard_of() as (guard, control):
        assert _ask_from_another_process(control, "adopt 0.001") == "held"
        assert _ask_from_another_process(control, "end") == "held"
        assert _ask_from_here(control, "hello") == f"guard {guard.pid}"
        assert guard.poll() is None
        assert _ask_from_here(control, "end") == "ending"  # this process holds it
        guard.wait(timeout=DEADLINE_S)



def test_a_guard_removes_only_the_sockets_it_owns_not_a_later_servers_at_its_path() -> None:
    """Another server's sockets at the same paths (bound after this guard's were removed)
    outlive this guard's end: it removes a path only while it is still its own inode."""
    with _guard_of(serving=True) as (guard, control):
        server_socket = control.with_suffix(".sock")
        _wait_until(lambda: _server_pid(control), "the server listens")
        later = []
        for path in (server_socket, control):
            path.unlink()
            bound = socket.socket(socket.AF_UNIX)
            bound.bind(str(path))
            bound.listen()
            later.append((path, bound, path.stat().st_ino))
        guard.send_signal(signal.SIGTERM)
        guard.wait(timeout=DEADLINE_S)
        for path, bound, inode in later:
            assert path.stat().st_ino == inode, f"{path} was removed"
            bound.close()


def test_a_guard_removes_its_own_sockets_and_their_directory_at_its_end() -> None:
    with _guard_of(serving=True) as (guard, control):
        _wait_until(lambda: _server_pid(control), "the server listens")
        guard.send_signal(signal.SIGTERM)
        guard.wait(timeout=DEADLINE_S)
        assert not control.parent.exists()


def test_an_error_in_the_guards_loop_still_ends_its_server_and_removes_its_sockets() -> None:
    with _guard_of(serving=True, failing=True) as (guard, control):
        guard.wait(timeout=DEADLINE_S)
        assert guard.returncode != 0
        assert not control.parent.exists()  # its sockets and their directory removed
        server = int(_server_pid(control))
        _wait_until(lambda: not alive(server), "the server ended")


@pytest.mark.parametrize("lease", ["nan", "inf", "1e300", "-1", "86401", "soon"])
def test_a_guard_refuses_a_lease_that_is_not_a_number_of_seconds_up_to_a_day(lease: str) -> None:
    """Even from the job holding it: a lease it cannot wait for would end its loop."""
    with _guard_of() as (guard, control):
        assert _ask_from_here(control, f"adopt {lease}") == "refused lease"
        assert _ask_from_here(control, "adopt 86400") == f"adopted {guard.pid}"


@pytest.mark.parametrize("seconds", [86400.5, 1e10, float("inf")])
def test_adopt_within_s_beyond_a_day_is_refused_naming_the_field(seconds: float) -> None:
    with pytest.raises(ConfigError) as error:
        config_from_builtins({"vllm": {"adopt_within_s": seconds}})
    assert error.value.path == "$.vllm.adopt_within_s" and "86400" in str(error.value)
