"""Shared fixtures of the ``rollout-recovery run`` tests (test_run_*.py).

- a small fast job (``fast_config`` / ``write_config``): 10 steps of 4 prompts x 4
  generations, 2 ms model calls, a checkpoint every 2 steps, low fault rates;
  ``fault_config`` is the same job with every fault off but the ones a test names;
- ``run_cli`` / ``run_cli_until``: the real CLI in a child interpreter in its own process
  group (``start_new_session=True``), stdout and stderr merged into one line stream;
  ``run_cli_until`` SIGKILLs the whole group as soon as a line satisfies a predicate, so a
  test synchronizes on what the child printed, never on sleeps;
- ``finished_run``: a private copy of one finished fast run per session
  (``finished_run_original``, which no test may change);
- ``dir_snapshot`` / ``read_jsonl``: what a directory holds, what a JSON-lines file says.

Every child still alive at the end of a test is killed by its process group id (it is
always a group this fixture started). A watchdog bounds every child's lifetime.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
import msgspec.inspect as mi
import pytest

from rollout_recovery._crashpoints import CRASH_AT_ENV, reset_crash_points_for_tests
from rollout_recovery.control import RunConfig
from rollout_recovery.control._config import config_from_builtins
from rollout_recovery.history._trail_check import check_trail
from rollout_recovery.job import run_job
from rollout_recovery.job._run_job import JobResult

Sections = Mapping[str, Mapping[str, Any]]

#: The small fast job most tests run (merged over the defaults; every fault rate is low).
FAST: dict[str, dict[str, Any]] = {
    "job": {"steps": 10, "prompts_per_step": 4, "generations_per_prompt": 4, "seed": 0},
    # The default 2 s deadline: a shorter one abandons healthy attempts on a loaded machine.
    "generation": {"call_latency_s": 0.002, "attempt_deadline_s": 2.0, "workers": 4},
    "retry": {"max_rounds": 8, "backoff_s": 0.001},
    "faults": {
        "attempt_failure_rate": 0.02,
        "straggler_rate": 0.05,
        "straggler_factor": 4.0,
        "hang_rate": 0.002,
        "capture_failure_rate": 0.01,
        "tamper_rate": 0.01,
        "worker_crash_rate": 0.002,
        "worker_restart_s": 0.05,
    },
    "checkpoint": {"every_steps": 2, "keep": 3},
    "liveness": {"step_timeout_s": 60.0},
}

#: Every fault off: a fault test turns on only the fault it is about.
NO_FAULTS: dict[str, dict[str, Any]] = {
    "faults": {
        "attempt_failure_rate": 0.0,
        "straggler_rate": 0.0,
        "hang_rate": 0.0,
        "capture_failure_rate": 0.0,
        "tamper_rate": 0.0,
        "worker_crash_rate": 0.0,
    }
}

#: Upper bound on any single child's lifetime (a watchdog kills the group after it).
CHILD_TIMEOUT_S = 120.0


def run_config_fields() -> list[tuple[str, str, mi.Type]]:
    """``(section, field, type)`` of every field of every section of ``RunConfig``, the
    type with its constraints (``Meta``) unwrapped."""
    found = []
    root = mi.type_info(RunConfig)
    assert isinstance(root, mi.StructType)
    for section in root.fields:
        section_type = _unwrapped(section.type)
        assert isinstance(section_type, mi.StructType)
        found += [(section.name, f.name, _unwrapped(f.type)) for f in section_type.fields]
    return found


def _unwrapped(kind: mi.Type) -> mi.Type:
    while isinstance(kind, mi.Metadata):
        kind = kind.type
    return kind


def merge_sections(*layers: Sections | None) -> dict[str, dict[str, Any]]:
    """Later layers override earlier ones, key by key inside each section."""
    merged: dict[str, dict[str, Any]] = {}
    for layer in layers:
        for section, values in (layer or {}).items():
            merged.setdefault(section, {}).update(copy.deepcopy(dict(values)))
    return merged


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    raise TypeError(f"cannot write {value!r} to the test TOML")


def sections_to_toml(sections: Sections) -> str:
    """A partial job TOML: only the keys given (the rest stay at their defaults)."""
    blocks = []
    for section, values in sections.items():
        lines = [f"[{section}]"] + [f"{key} = {_toml_value(v)}" for key, v in values.items()]
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks)


@pytest.fixture(autouse=True)
def _unarmed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # An armed variable reaching an in-process run would SIGKILL pytest itself.
    monkeypatch.delenv(CRASH_AT_ENV, raising=False)
    reset_crash_points_for_tests()
    yield
    reset_crash_points_for_tests()


@pytest.fixture
def fast_config() -> Callable[..., RunConfig]:
    """``fast_config({"faults": {...}}, fast=True)``: the fast job with overrides."""

    def make(overrides: Sections | None = None, *, fast: bool = True) -> RunConfig:
        return config_from_builtins(merge_sections(FAST if fast else None, overrides))

    return make


@pytest.fixture
def fault_config() -> Callable[..., RunConfig]:
    """``fault_config({"hang_rate": 0.2}, {"generation": {...}})``: the fast job with every
    fault off but the ones given, plus any other overrides.

    The attempt deadline is generous (5 s) unless overridden: with no hang injected, an
    attempt slowed by a loaded machine must not be abandoned as ``deadline_exceeded`` and
    blur which fault a test is about.
    """

    def make(faults: Mapping[str, Any], overrides: Sections | None = None) -> RunConfig:
        generous = {"generation": {"attempt_deadline_s": 5.0}}
        layers = (FAST, NO_FAULTS, generous, {"faults": faults}, overrides)
        return config_from_builtins(merge_sections(*layers))

    return make


@pytest.fixture
def write_config(tmp_path: Path) -> Callable[..., Path]:
    """``write_config({"job": {...}}, fast=True, faults_off=False)``: a TOML file for
    ``--config`` (``faults_off``: every fault rate 0 before the overrides)."""
    counter = iter(range(1_000_000))

    def write(
        overrides: Sections | None = None, *, fast: bool = True, faults_off: bool = False
    ) -> Path:
        path = tmp_path / f"config-{next(counter)}.toml"
        layers = (FAST if fast else None, NO_FAULTS if faults_off else None, overrides)
        path.write_text(sections_to_toml(merge_sections(*layers)))
        return path

    return write


def _child_env(extra: Mapping[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop(CRASH_AT_ENV, None)
    env["PYTHONUNBUFFERED"] = "1"
    env["COLUMNS"] = "200"  # one plain line per log message, whatever the message length
    env.update(extra or {})
    return env


class _Children:
    """The process groups this test started; whatever is still alive is killed at the end."""

    def __init__(self) -> None:
        self.processes: list[subprocess.Popen[str]] = []

    def start(self, args: Sequence[str], env: Mapping[str, str] | None) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [sys.executable, "-m", "rollout_recovery", "run", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env=_child_env(env),
            start_new_session=True,  # its own process group: one killpg reaches it all
        )
        self.processes.append(process)
        return process

    @staticmethod
    def kill_group(process: subprocess.Popen[str]) -> None:
        # Only while unreaped: then the group id is still ours, never a reused pid's.
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)

    def close(self) -> None:
        for process in self.processes:
            self.kill_group(process)
            process.wait()
            if process.stdout is not None:
                process.stdout.close()


@pytest.fixture
def _children() -> Iterator[_Children]:
    children = _Children()
    yield children
    children.close()


def _drive(
    children: _Children,
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None,
    stop: Callable[[str, list[str]], bool] | None,
    timeout: float,
) -> subprocess.CompletedProcess[str]:
    process = children.start(args, env)
    timed_out = threading.Event()

    def expire() -> None:
        timed_out.set()
        children.kill_group(process)

    watchdog = threading.Timer(timeout, expire)
    watchdog.start()
    lines: list[str] = []
    try:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if stop is not None and process.poll() is None and stop(line, lines):
                children.kill_group(process)
                # Drain what was already written, then stop reading.
                lines.extend(process.stdout.read().splitlines(keepends=True))
                break
        returncode = process.wait()
    finally:
        watchdog.cancel()
    output = "".join(lines)
    if timed_out.is_set():
        pytest.fail(f"rollout-recovery run {' '.join(args)} ran over {timeout} s:\n{output}")
    return subprocess.CompletedProcess(list(args), returncode, output, "")


@pytest.fixture
def run_cli(_children: _Children) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``run_cli([args], env={...})``: ``rollout-recovery run ARGS`` to its end.

    The result's ``stdout`` holds stdout and stderr merged, in order.
    """

    def run(
        args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float = CHILD_TIMEOUT_S,
    ) -> subprocess.CompletedProcess[str]:
        return _drive(_children, args, env=env, stop=None, timeout=timeout)

    return run


def run_cli_once(
    args: Sequence[str],
    *,
    stop: Callable[[str, list[str]], bool] | None,
    env: Mapping[str, str] | None = None,
    timeout: float = CHILD_TIMEOUT_S,
) -> subprocess.CompletedProcess[str]:
    """``run_cli_until`` (or ``run_cli`` with no ``stop``) outside a test, for a module or
    session fixture: its child's group is killed and reaped before it returns."""
    children = _Children()
    try:
        return _drive(children, args, env=env, stop=stop, timeout=timeout)
    finally:
        children.close()


@pytest.fixture
def run_cli_until(_children: _Children) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``run_cli_until([args], stop=lambda line, lines: ...)``: SIGKILL the child's process
    group as soon as ``stop`` accepts an output line (``returncode == -9`` then), or let
    it run to its end if no line does."""

    def run(
        args: Sequence[str],
        *,
        stop: Callable[[str, list[str]], bool],
        env: Mapping[str, str] | None = None,
        timeout: float = CHILD_TIMEOUT_S,
    ) -> subprocess.CompletedProcess[str]:
        return _drive(_children, args, env=env, stop=stop, timeout=timeout)

    return run


def snapshot_directory(root: Path) -> dict[str, tuple[int, int, str]]:
    """``{relative path: (size, mtime_ns, sha256)}`` of every file under ``root``
    (directories as ``(-1, mtime_ns, "")``)."""
    found: dict[str, tuple[int, int, str]] = {}
    for path in sorted(root.rglob("*")):
        stat = path.lstat()
        relative = str(path.relative_to(root))
        if path.is_dir():
            found[relative + "/"] = (-1, stat.st_mtime_ns, "")
        else:
            found[relative] = (stat.st_size, stat.st_mtime_ns, _sha256(path))
    return found


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def dir_snapshot() -> Callable[[Path], dict[str, tuple[int, int, str]]]:
    return snapshot_directory


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]


@pytest.fixture(name="read_jsonl")
def read_jsonl_fixture() -> Callable[[Path], list[dict[str, Any]]]:
    return read_jsonl


def backend_events(events: Sequence[Mapping[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The ``backend`` records of ``kind`` (a server's state change, an actor's death...),
    each as its detail plus its kind."""
    return [
        {"kind": e["kind"], **e["detail"]}
        for e in events
        if e["event"] == "backend" and e["kind"] == kind
    ]


def trained_rows(out: Path) -> list[dict[str, Any]]:
    """Every row the run's history says was trained and not rolled back, as a dict with
    its ``step`` (what ``trained_rows.jsonl`` held before the journal)."""
    report = check_trail(out, complete=False)
    return [{"step": step, **msgspec.structs.asdict(row)} for step, row in report.rows]


@pytest.fixture(name="trained_rows")
def trained_rows_fixture() -> Callable[[Path], list[dict[str, Any]]]:
    return trained_rows


def rewrite_checkpoint_file(checkpoint: Path, name: str, data: bytes) -> None:
    """Replace one file of a committed checkpoint and its manifest entry: the checkpoint
    still loads (sizes and sha256 match); only what the file says is wrong."""
    (checkpoint / name).write_bytes(data)
    manifest_path = checkpoint / "COMMITTED"
    manifest = json.loads(manifest_path.read_text())
    manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    manifest_path.write_text(json.dumps(manifest, sort_keys=True, indent=1) + "\n")


@pytest.fixture(scope="session")
def finished_run_original(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, RunConfig, JobResult]:
    """One in-process run of the fast job, shared by the session: never change it."""
    config = config_from_builtins(FAST)
    out = tmp_path_factory.mktemp("finished") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(CRASH_AT_ENV, raising=False)
        reset_crash_points_for_tests()
        result = run_job(out, config)
        reset_crash_points_for_tests()
    return out, config, result


@pytest.fixture
def finished_run(
    finished_run_original: tuple[Path, RunConfig, JobResult], tmp_path: Path
) -> tuple[Path, RunConfig]:
    """A private copy (mtimes kept) of one finished run of the fast job, and its config."""
    master, config, _ = finished_run_original
    copy_dir = tmp_path / "finished-run"
    shutil.copytree(master, copy_dir)
    return copy_dir, config
