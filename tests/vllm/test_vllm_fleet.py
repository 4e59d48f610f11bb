"""Launched vLLM servers: started, listed, given the job's key, and gone with the job.

``fake_vllm_server.py`` stands in for vLLM (``[vllm] python`` is a script that runs it),
with a child that ignores SIGTERM like vLLM's ``EngineCore``. The real server is started
by ``tests/integration`` (``bash .ci/vllm-integration``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import stat
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import msgspec
import pytest
from process_support import alive, ready_job

from rollout_recovery._unix_http import require_private_dir, unix_server_url
from rollout_recovery.control import RunConfig, load_config
from rollout_recovery.control._backends import _vllm_sync
from rollout_recovery.control._config import config_from_builtins
from rollout_recovery.dataplane import DataPlane
from rollout_recovery.errors import ConfigError, GenerationError
from rollout_recovery.job import JobComponents, run_job
from rollout_recovery.policy import NumpyGRPOTrainer
from rollout_recovery.rollout import HttpConfig
from rollout_recovery.vllm import VllmConfig
from rollout_recovery.vllm._config import check_vllm_config
from rollout_recovery.vllm._fleet import EXTENSION_CLASS, EXTENSION_DIR, VllmFleet, launched_by

FAKE = Path(__file__).with_name("fake_vllm_server.py")
#: Bounds on waits for processes to appear or vanish: generous for a loaded machine.
DEADLINE_S = 60.0


def _fake_python(tmp_path: Path) -> Path:
    script = tmp_path / "vllm-python"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def _model(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    return model


def _config(tmp_path: Path, launch: int = 2, **overrides: object) -> VllmConfig:
    fields: dict[str, object] = {
        "launch": launch,
        "python": str(_fake_python(tmp_path)),
        "model": str(_model(tmp_path)),
        "startup_timeout_s": DEADLINE_S,
    }
    fields.update(overrides)
    return VllmConfig(**fields)  # type: ignore[arg-type]


def _wait_until(predicate: object, what: str) -> None:
    # Bounded polling of the OS's own state (no event to wait on for another process).
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


def _records(directory: Path) -> list[dict[str, object]]:
    return [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]


@pytest.fixture
def fake_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Where the fake servers record themselves; any group a failed test left is killed."""
    out = tmp_path / "fake-vllm"
    out.mkdir()
    monkeypatch.setenv("FAKE_VLLM_DIR", str(out))
    yield out
    for record in _records(out):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(record["pgid"]), signal.SIGKILL)  # type: ignore[call-overload]


def _health(listed: dict[str, object]) -> int:
    """``GET /health`` of a listed server, on its socket."""
    transport = httpx.HTTPTransport(uds=str(listed["socket"]))
    with httpx.Client(transport=transport, timeout=5.0) as client:
        return client.get("http://localhost/health").status_code


def test_the_fleet_starts_listed_servers_with_the_jobs_key_and_stops_every_process(
    tmp_path: Path, fake_dir: Path
) -> None:
    run = tmp_path / "run"
    fleet = VllmFleet(
        run / "servers", run / "servers.json", _config(tmp_path), served_model_name="m"
    )
    with fleet:
        urls = fleet.start()
        assert len(urls) == 2
        listing = json.loads((run / "servers.json").read_text())["servers"]
        assert [s["url"] for s in listing] == urls and {s["kind"] for s in listing} == {"vllm"}
        for listed in listing:
            assert _health(listed) == 200
            assert listed["url"] == unix_server_url(listed["socket"])
        records = _records(fake_dir)
        processes = [int(r["pid"]) for r in records] + [int(r["child"]) for r in records]
        sockets = Path(listing[0]["socket"]).parent
    for record in records:
        argv = record["argv"]
        assert isinstance(argv, list)
        assert argv[:2] == ["-m", "vllm.entrypoints.openai.api_server"]
        assert argv[argv.index("--worker-extension-cls") + 1] == EXTENSION_CLASS
        assert argv[argv.index("--served-model-name") + 1] == "m"
        assert Path(argv[argv.index("--uds") + 1]).parent == sockets
        assert "--port" not in argv and "--host" not in argv  # no TCP port at all
        assert fleet.api_key not in argv  # the key is never in argv (``ps`` shows it)
        env = record["env"]
        assert isinstance(env, dict)
        assert env["VLLM_API_KEY"] == fleet.api_key and env["VLLM_SERVER_DEV_MODE"] == "1"
        assert str(EXTENSION_DIR) in str(env["PYTHONPATH"]).split(os.pathsep)
    # Stopped: each server was asked to shut down (SIGTERM reached it), then the child
    # that ignores SIGTERM was killed; nothing of either group is left, nor the sockets.
    assert len(list(fake_dir.glob("*.terminated"))) == 2
    assert not [pid for pid in processes if alive(pid)]
    assert not sockets.exists()
    fleet.close()  # closing again is a no-op
    assert len(list(fake_dir.glob("*.terminated"))) == 2


class _Intruder(ThreadingHTTPServer):
    """Another local user's listener: answers everything 200 and keeps what it is sent."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        intruder = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # the http.server API's name
                intruder.seen.append(f"{self.path} {self.headers.get('Authorization')}")
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)


def test_a_listener_on_the_port_the_job_would_pick_is_never_taken_for_its_server(
    tmp_path: Path, fake_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24 item 10: the job picked a free port, closed it and started vLLM on it;
    whoever bound it first was taken as the server (192 requests with the job's key).
    Here the intruder holds the very port the job would have picked: it hears nothing,
    and what answers each URL is the process the job launched."""
    intruder = _Intruder()
    threading.Thread(target=intruder.serve_forever, daemon=True).start()
    monkeypatch.setattr(
        "rollout_recovery.vllm._fleet._free_port", lambda: intruder.server_port, raising=False
    )
    run = tmp_path / "run"
    fleet = VllmFleet(
        run / "servers", run / "servers.json", _config(tmp_path), served_model_name="m"
    )
    try:
        with fleet:
            fleet.start()
            assert intruder.seen == []  # not even asked: no key, no weights, no calls
            listing = json.loads((run / "servers.json").read_text())["servers"]
            for listed in listing:
                assert launched_by(Path(listed["socket"]), int(listed["pid"]))
                assert not launched_by(Path(listed["socket"]), os.getpgrp())
            sockets = Path(listing[0]["socket"]).parent
            info = sockets.stat()
            assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.getuid()
            require_private_dir(sockets)
    finally:
        intruder.shutdown()
        intruder.server_close()
    assert intruder.seen == []
    # The fleet's readiness probes went to the launched servers.
    for name in ("vllm-0", "vllm-1"):
        heard = (fake_dir / f"{name}.requests").read_text().splitlines()
        assert heard and all(line.startswith("GET /health ") for line in heard)


def test_a_socket_another_process_listens_on_fails_the_start(
    tmp_path: Path, fake_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only this user can bind in the socket's directory; still, a listener outside the
    launched group (a bug, or this user's other process) is refused by name."""
    monkeypatch.setenv("FAKE_VLLM_SILENT", "1")
    run = tmp_path / "run"
    fleet = VllmFleet(
        run / "servers",
        run / "servers.json",
        _config(tmp_path, launch=1),
        served_model_name="m",
    )
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)

    def bind_when_asked() -> None:
        _wait_until(lambda: (fake_dir / "vllm-0.socket").exists(), "the server named its socket")
        listener.bind((fake_dir / "vllm-0.socket").read_text())
        listener.listen()

    binder = threading.Thread(target=bind_when_asked, daemon=True)
    binder.start()
    try:
        with pytest.raises(GenerationError, match=rf"listened on by pid {os.getpid()}"), fleet:
            fleet.start()
    finally:
        binder.join(DEADLINE_S)
        listener.close()
    assert not (run / "servers.json").exists()


JOB = """
import sys, threading
from pathlib import Path
import msgspec
from rollout_recovery.vllm import VllmConfig
from rollout_recovery.vllm._fleet import VllmFleet
config = msgspec.json.decode(sys.argv[1], type=VllmConfig)
run = Path(sys.argv[2])
with VllmFleet(run / "servers", run / "servers.json", config, served_model_name="m") as fleet:
    fleet.start()
    print("ready", flush=True)
    threading.Event().wait()
"""


def test_servers_end_when_the_job_that_started_them_is_sigkilled(
    tmp_path: Path, fake_dir: Path
) -> None:
    """With ``adopt_within_s = 0`` no rerun may adopt them: they end with the job
    (``test_vllm_adoption.py``: with a lease)."""
    config = _config(tmp_path, launch=1, adopt_within_s=0.0)
    encoded = msgspec.json.encode(config).decode()
    with ready_job(JOB, encoded, str(tmp_path / "run")) as job:
        (record,) = _records(fake_dir)
        processes = [int(record["pid"]), int(record["child"])]  # type: ignore[call-overload]
        assert all(alive(pid) for pid in processes)
        (listed,) = json.loads((tmp_path / "run" / "servers.json").read_text())["servers"]
        sockets = Path(listed["socket"]).parent
        os.kill(job.pid, signal.SIGKILL)
        job.wait()
        _wait_until(lambda: not any(alive(pid) for pid in processes), "the server group ended")
        assert list(fake_dir.glob("*.terminated"))  # shut down, not only killed
        # Its guard removed the socket and its directory: nothing is left in /tmp.
        _wait_until(lambda: not sockets.exists(), "the socket directory was removed")


def test_a_server_that_exits_before_it_is_ready_fails_the_start_with_its_log(
    tmp_path: Path, fake_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_VLLM_EXIT", "3")
    run = tmp_path / "run"
    fleet = VllmFleet(
        run / "servers", run / "servers.json", _config(tmp_path), served_model_name="m"
    )
    with pytest.raises(GenerationError, match=r"exited with 3.*exiting on purpose"), fleet:
        fleet.start()
    assert not (run / "servers.json").exists()


def test_a_missing_vllm_python_or_model_is_refused_naming_the_field(tmp_path: Path) -> None:
    fleet = VllmFleet(
        tmp_path / "s",
        tmp_path / "s.json",
        _config(tmp_path, python=str(tmp_path / "nope")),
        served_model_name="m",
    )
    with pytest.raises(ConfigError) as error, fleet:
        fleet.start()
    assert error.value.path == "$.vllm.python"
    config = msgspec.structs.replace(_config(tmp_path), model=str(tmp_path / "no-model"))
    with (
        pytest.raises(ConfigError) as error,
        VllmFleet(tmp_path / "s", tmp_path / "s.json", config, served_model_name="m") as fleet,
    ):
        fleet.start()
    assert error.value.path == "$.vllm.model"
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(
    ("vllm", "http", "path"),
    [
        (
            {"launch": 1, "python": "p", "model": "m"},
            {"weight_sync": "vllm", "servers": ("http://h:1",)},
            "$.vllm.launch",
        ),
        ({"launch": 1, "python": "p", "model": "m"}, {}, "$.http.weight_sync"),
        ({"launch": 1, "model": "m"}, {"weight_sync": "vllm"}, "$.vllm.python"),
        ({"launch": 1, "python": "p"}, {"weight_sync": "vllm"}, "$.vllm.model"),
        ({}, {"weight_sync": "vllm"}, "$.http.weight_sync"),
    ],
)
def test_vllm_settings_that_cannot_work_are_refused_naming_the_field(
    vllm: dict[str, object], http: dict[str, object], path: str
) -> None:
    with pytest.raises(ConfigError) as error:
        check_vllm_config(VllmConfig(**vllm), HttpConfig(**http), servers=True)  # type: ignore[arg-type]
    assert error.value.path == path


def test_ray_http_workers_cannot_use_the_vllm_weight_sync() -> None:
    # The Ray backend's own pairing: its servers take the numpy policy's syncs only.
    ray_on = {"generation": {"backend": "ray"}, "ray": {"worker": "http"}}
    http = {"weight_sync": "vllm", "servers": ["http://h:1"]}
    with pytest.raises(ConfigError) as error:
        config_from_builtins({**ray_on, "http": http})
    assert error.value.path == "$.http.weight_sync"
    # Workers that run the simulated environment use no [http] servers: ignored.
    config_from_builtins({"generation": {"backend": "ray"}, "http": http})


def test_vllm_settings_that_work_pass() -> None:
    launched = VllmConfig(launch=2, python="p", model="m")
    check_vllm_config(launched, HttpConfig(weight_sync="vllm"), servers=True)
    check_vllm_config(
        VllmConfig(), HttpConfig(weight_sync="vllm", servers=("http://h:1",)), servers=True
    )
    check_vllm_config(VllmConfig(), HttpConfig(), servers=False)
    check_vllm_config(launched, HttpConfig(), servers=False)  # no HTTP servers: ignored
    # No model: the torch trainer's own (it has one; check_combination knows which).
    check_vllm_config(
        VllmConfig(launch=1, python="p"),
        HttpConfig(weight_sync="vllm"),
        servers=True,
        trainer_model=True,
    )


#: The LLM job on launched vLLM servers, as a config file states it (``{python}``,
#: ``{model}``: the ``[vllm] python`` and the trainer's ``[model] source``).
LLM_ON_VLLM = (
    '[trainer]\nkind = "torch"\n[task]\nkind = "emit_token"\n'
    '[generation]\nbackend = "http"\n[http]\nweight_sync = "vllm"\n'
    '[model]\nsource = "{model}"\n[vllm]\nlaunch = 1\npython = "{python}"\n'
)


def test_a_job_with_a_missing_vllm_venv_is_refused_before_it_writes_anything(
    tmp_path: Path,
) -> None:
    """Refused before the trainer's model is even looked at: ``[vllm] model`` is empty,
    so the servers would serve the trainer's (here a directory that does not exist)."""
    path = tmp_path / "job.toml"
    path.write_text(LLM_ON_VLLM.format(model=tmp_path / "no-model", python=tmp_path / "nope"))
    out = tmp_path / "run"
    with pytest.raises(ConfigError) as error:
        run_job(out, load_config(path))
    assert error.value.path == "$.vllm.python"
    assert not out.exists()


def test_a_numpy_job_cannot_use_the_vllm_weight_sync() -> None:
    """The default job's numpy policy cannot be loaded into vLLM: refused when the config
    is read, naming the field, before any server starts."""
    with pytest.raises(ConfigError) as error:
        config_from_builtins(
            {
                "generation": {"backend": "http"},
                "http": {"weight_sync": "vllm"},
                "vllm": {"launch": 1, "python": "p", "model": "m"},
            }
        )
    assert error.value.path == "$.http.weight_sync"
    assert "numpy" in str(error.value)


def test_the_vllm_weight_sync_refuses_a_trainer_whose_weights_it_cannot_load(
    tmp_path: Path, fake_dir: Path
) -> None:
    """Components a user plugs in get the same check: a trainer whose weights are not
    ``TorchWeights`` is refused before any weights are sent, naming the field, and the
    launched server (started from the trainer's model) is stopped."""
    pytest.importorskip("torch")  # the LLM job's config passes through resolve_model
    model = _model(tmp_path)
    (model / "model.safetensors").write_bytes(b"")  # hashed for the digest, never loaded
    path = tmp_path / "job.toml"
    path.write_text(LLM_ON_VLLM.format(model=model, python=_fake_python(tmp_path)))

    def numpy_trainer_on_vllm(config: RunConfig, data_plane: DataPlane) -> JobComponents:
        _vllm_sync(config, NumpyGRPOTrainer(seed=0))
        raise AssertionError("the numpy trainer's weights were accepted")

    with pytest.raises(ConfigError) as error:
        run_job(tmp_path / "run", load_config(path), components=numpy_trainer_on_vllm)
    assert error.value.path == "$.http.weight_sync"
    assert "PolicySnapshot" in str(error.value)
    # The server was launched from the trainer's model ([vllm] model is empty) and stopped.
    [record] = _records(fake_dir)
    argv = record["argv"]
    assert isinstance(argv, list) and argv[argv.index("--model") + 1] == str(model.resolve())
    assert len(list(fake_dir.glob("*.terminated"))) == 1


def test_the_start_says_where_the_logs_are_and_how_long_each_server_took(
    tmp_path: Path, fake_dir: Path
) -> None:
    """vLLM takes about a minute to start on CPU: the job says so, names the logs, says
    how long it has waited every ``progress_every_s`` and when each server is ready."""
    heard: list[str] = []
    run = tmp_path / "run"
    fleet = VllmFleet(
        run / "servers",
        run / "servers.json",
        _config(tmp_path),
        served_model_name="m",
        log=heard.append,
        progress_every_s=0.0,
    )
    with fleet:
        urls = fleet.start()
    assert heard[0].startswith("starting 2 vLLM server(s) from ")
    assert f"their logs: {run / 'servers'}/vllm-<n>.log" in heard[0]
    ready = [line for line in heard if line.startswith("vLLM server ")]
    assert sorted(line.split(" ready at ")[1].split(" (")[0] for line in ready) == sorted(urls)
    assert all(line.endswith(" s)") for line in ready)
    # Every poll that found a server still starting said so, naming its log.
    for line in heard[1:]:
        assert line in ready or (
            line.startswith("waiting for vLLM: ") and "/vllm-" in line and " ends: " in line
        )
