"""A server that answers every call with ``200`` and an HTML page (issue 15, item 12).

It used to mask every row (40 of 40), and the run exited 0 with a passing audit. Now:

- its bad replies count against it: beside a good server it is taken out of rotation
  (``server_bad_data``), the run trains on the good one, and the summary, the metrics
  and the audit all report the fraction of valid rows;
- a run that trains no valid row for ``job.max_steps_without_valid_rows`` steps in a row
  (the garbage server kept in rotation) stops with ``NoValidRowsError`` saying so, without
  the advice to rerun.

The HTML server is a real HTTP server on 127.0.0.1 in a thread of the test; the job talks
to it as to any OpenAI-compatible server (``weight_sync = "none"``, as for a server the
user runs: it is never asked to load weights, so it gets calls as soon as it answers its
probes).
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from run_fixtures import backend_events
from serve_process import running_serve

from rollout_recovery.control import RunConfig
from rollout_recovery.history import audit_run
from rollout_recovery.job import run_job

Cli = Callable[..., subprocess.CompletedProcess[str]]
ReadJsonl = Callable[[Path], list[dict[str, Any]]]

PAGE = b"<!doctype html><html><body><h1>Please sign in to continue</h1></body></html>"


class _HtmlPage(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def html_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _HtmlPage)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def good_server(tmp_path: Path) -> Iterator[str]:
    """A real ``rollout-recovery serve`` in its own process group."""
    with running_serve(tmp_path / "serve.log") as url:
        yield url


def _http_job(servers: list[str], **http: Any) -> dict[str, dict[str, Any]]:
    return {
        "generation": {"backend": "http", "call_latency_s": 0.0, "attempt_deadline_s": 10.0},
        "http": {"servers": servers, "weight_sync": "none", "probe_interval_s": 0.1, **http},
    }


def test_a_run_that_trains_no_valid_row_for_k_steps_stops_saying_so(
    tmp_path: Path,
    html_server: str,
    write_config: Callable[..., Path],
    run_cli: Cli,
    read_jsonl: ReadJsonl,
) -> None:
    out = tmp_path / "run"
    # Kept in rotation whatever it answers, so every row of every step is a placeholder.
    job = {
        "job": {"steps": 10, "max_steps_without_valid_rows": 2},
        **_http_job([html_server], dead_after_failures=10**6),
    }
    result = run_cli(["--out", str(out), "--config", str(write_config(job)), "--plain"])

    assert result.returncode == 1, result.stdout
    assert (
        "error: the run stopped: NoValidRowsError: 2 steps in a row (through step 1) trained "
        "no valid row: every row was a masked placeholder" in result.stdout
    )
    assert "data_error:malformed_reply x16" in result.stdout
    assert "job.max_steps_without_valid_rows" in result.stdout
    assert "rerun the same command" not in result.stdout
    assert "Traceback" not in result.stdout
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [(m["step"], m["valid_rows"], m["valid_row_fraction"]) for m in metrics] == [
        (0, 0, 0.0),
        (1, 0, 0.0),
    ]
    report = audit_run(out)
    assert report.counts["rows"] == 32 and report.counts["valid_rows"] == 0
    assert report.counts["valid_row_fraction"] == 0.0


def test_a_garbage_server_beside_a_good_one_is_taken_out_and_the_valid_fraction_reported(
    tmp_path: Path,
    html_server: str,
    good_server: str,
    fast_config: Callable[..., RunConfig],
    read_jsonl: ReadJsonl,
) -> None:
    out = tmp_path / "run"
    config = fast_config({"job": {"steps": 6}, **_http_job([good_server, html_server])})

    result = run_job(out, config)

    assert result.summary.steps == 6
    metrics = read_jsonl(out / "metrics.jsonl")
    rows = sum(m["rows"] for m in metrics)
    valid = sum(m["valid_rows"] for m in metrics)
    # Its replies were masked until its bad replies took it out; the rest trained valid.
    assert 0 < valid < rows
    assert result.summary.valid_row_fraction == valid / rows
    assert any(m["valid_row_fraction"] < 1.0 for m in metrics)
    events = read_jsonl(out / "events.jsonl")
    bad = backend_events(events, "server_bad_data")
    assert bad and all(e["server"] == html_server for e in bad)
    assert all(e["reason"] == "malformed_reply" for e in bad)
    servers = metrics[-1]["backend"]["servers"]
    assert servers[html_server]["deaths"] >= 1
    # Every reply it sent was refused; a call still in flight when its attempt's deadline
    # cancelled it (a loaded machine) got no reply, so it counts as a call only.
    assert 0 < servers[html_server]["data_failures"] <= servers[html_server]["calls"]
    assert servers[good_server]["state"] == "healthy"
    assert servers[good_server]["data_failures"] == 0
    report = audit_run(out)
    assert report.ok and report.complete, report.violations
    assert report.counts["valid_rows"] == valid
    assert report.counts["valid_row_fraction"] == round(valid / rows, 4)
