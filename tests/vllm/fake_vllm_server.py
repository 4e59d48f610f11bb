"""A stand-in for ``python -m vllm.entrypoints.openai.api_server`` in the fleet tests.

The fleet runs ``[vllm] python -m vllm.entrypoints.openai.api_server --port P ...``; a test
points ``[vllm] python`` at a small executable that runs this file instead (standard
library only). It answers ``GET /health`` on 127.0.0.1:P, starts a child that ignores
SIGTERM (as vLLM's ``EngineCore`` outlives a killed API server), and records in
``$FAKE_VLLM_DIR/<port>.json`` its argv, the environment variables the fleet sets and its
child's pid and its process group; on SIGTERM it writes ``<port>.terminated`` and exits.
``FAKE_VLLM_EXIT=CODE`` makes it print a line and exit at once instead.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

_IDLE_CHILD = (
    "import signal, threading; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "threading.Event().wait()"
)


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # the http.server API's name
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def main(argv: list[str]) -> int:
    if os.environ.get("FAKE_VLLM_EXIT"):
        print("fake vllm: exiting on purpose", flush=True)
        return int(os.environ["FAKE_VLLM_EXIT"])
    port = int(argv[argv.index("--port") + 1])
    out = Path(os.environ["FAKE_VLLM_DIR"])
    child = subprocess.Popen([sys.executable, "-c", _IDLE_CHILD])
    server = ThreadingHTTPServer(("127.0.0.1", port), _Health)
    stopped = threading.Event()

    def on_term(signum: int, frame: object) -> None:
        (out / f"{port}.terminated").write_text("")
        stopped.set()

    signal.signal(signal.SIGTERM, on_term)
    env = {k: os.environ.get(k) for k in ("VLLM_SERVER_DEV_MODE", "VLLM_API_KEY", "PYTHONPATH")}
    record = {
        "argv": argv,
        "env": env,
        "child": child.pid,
        "pid": os.getpid(),
        "pgid": os.getpgrp(),
    }
    (out / f"{port}.json").write_text(json.dumps(record))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stopped.wait()
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
