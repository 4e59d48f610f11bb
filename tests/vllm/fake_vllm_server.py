"""A stand-in for ``python -m vllm.entrypoints.openai.api_server`` in the fleet tests.

The fleet runs ``[vllm] python -m vllm.entrypoints.openai.api_server --uds S ...``; a test
points ``[vllm] python`` at a small executable that runs this file instead (standard
library only). It answers ``GET /health`` on the Unix socket S (or on 127.0.0.1:P for
``--port P``), starts a child that ignores SIGTERM (as vLLM's ``EngineCore`` outlives a
killed API server), and records in ``$FAKE_VLLM_DIR/<name>.json`` (the socket's name, or
the port) its argv, the environment variables the fleet sets, its child's pid and its
process group, and appends every request it answers to ``<name>.requests``; on SIGTERM it
writes ``<name>.terminated`` and exits. ``FAKE_VLLM_EXIT=CODE`` makes it print a line and
exit at once instead; ``FAKE_VLLM_SILENT=1`` makes it write its socket's path to
``<name>.socket`` and never listen (a test binds the socket from outside its group).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import socketserver
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
    requests: Path

    def do_GET(self) -> None:  # the http.server API's name
        with open(self.requests, "a") as log:
            log.write(f"{self.command} {self.path} {self.headers.get('Authorization')}\n")
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


class _UnixServer(ThreadingHTTPServer):
    address_family = socket.AF_UNIX

    def server_bind(self) -> None:  # no host name to look up for a socket
        socketserver.TCPServer.server_bind(self)


def main(argv: list[str]) -> int:
    if os.environ.get("FAKE_VLLM_EXIT"):
        print("fake vllm: exiting on purpose", flush=True)
        return int(os.environ["FAKE_VLLM_EXIT"])
    out = Path(os.environ["FAKE_VLLM_DIR"])
    if "--uds" in argv:
        path = argv[argv.index("--uds") + 1]
        name = Path(path).stem
        if os.environ.get("FAKE_VLLM_SILENT"):
            (out / f"{name}.socket").write_text(path)
            threading.Event().wait()  # until the fleet ends the group
        server: ThreadingHTTPServer = _UnixServer(path, _Health)
    else:
        name = argv[argv.index("--port") + 1]
        server = ThreadingHTTPServer(("127.0.0.1", int(name)), _Health)
    _Health.requests = out / f"{name}.requests"
    child = subprocess.Popen([sys.executable, "-c", _IDLE_CHILD])
    stopped = threading.Event()

    def on_term(signum: int, frame: object) -> None:
        (out / f"{name}.terminated").write_text("")
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
    (out / f"{name}.json").write_text(json.dumps(record))
    # SIGTERM reaches the main thread only: one delivered to a request's thread would run
    # on_term never (Python runs handlers in the main thread, which it would not wake).
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    threading.Thread(target=server.serve_forever, daemon=True).start()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    stopped.wait()
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
