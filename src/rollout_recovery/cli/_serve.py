"""``rollout-recovery serve``: the numpy policy behind an OpenAI-compatible HTTP server."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

import click

from ..errors import InvalidArgumentError, InvalidStateError
from ..serve import PolicyServer, ServeSettings

__all__ = ["serve"]

_LOOPBACK = {"127.0.0.1", "localhost", "::1"}
_DEFAULTS = ServeSettings()
# How often --exit-with-parent looks for its parent.
_PARENT_POLL_S = 0.2


def _api_key(name: str | None) -> str | None:
    """The API key held by the environment variable ``name`` (never echoed back)."""
    if name is None:
        return None
    key = os.environ.get(name, "")
    if not key:
        raise click.BadParameter(
            f"the environment variable {name} is unset or empty: export the API key in it",
            param_hint="'--api-key-env'",
        )
    try:
        ServeSettings(api_key=key)
    except InvalidArgumentError:
        raise click.BadParameter(
            f"the API key in {name} must be visible ASCII characters without spaces",
            param_hint="'--api-key-env'",
        ) from None
    return key


def _remove_own_ready_file(path: Path) -> None:
    # Only while it still names this process: a new server may have replaced it.
    with contextlib.suppress(OSError, InvalidStateError):
        if PolicyServer.read_ready_file(path).pid == os.getpid():
            path.unlink()


def _watch_parent(parent: int, stop: threading.Event) -> None:
    """Set ``stop`` once ``parent`` has died: this process is reparented, or (when it was
    started by another one, as a restarted server is) ``parent`` no longer exists."""
    child_of_parent = os.getppid() == parent

    def gone() -> bool:
        if child_of_parent:
            return os.getppid() != parent
        try:
            os.kill(parent, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False  # it exists, under another user
        return False

    def watch() -> None:
        while not stop.wait(_PARENT_POLL_S):
            if gone():
                stop.set()

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


@click.command("serve")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to bind. WARNING: without --api-key-env anyone who can reach the server "
    "can generate and replace the weights. Bind another address on a trusted network only.",
)
@click.option(
    "--uds",
    metavar="PATH",
    help="Listen on this Unix socket (an absolute path ending in .sock) instead of --host "
    "and --port: put it in a directory only you can enter and no other user can reach the "
    "server or take its address. A socket file left there by a killed server is replaced.",
)
@click.option(
    "--remove-socket-dir",
    is_flag=True,
    help="With --uds: when stopping, also remove the socket's directory if it is then empty "
    "(the directory is the caller's, made for its servers, as a job's launched servers' is).",
)
@click.option(
    "--api-key-env",
    metavar="NAME",
    help="Require 'Authorization: Bearer KEY' on every request, /health included, where KEY "
    "is the value of the environment variable NAME (an environment variable, not an "
    "argument: arguments are visible to every user in ps). Refused to start if NAME is unset.",
)
@click.option(
    "--allow-host",
    "allow_hosts",
    metavar="HOST",
    multiple=True,
    help="Also answer requests whose Host header names HOST (repeatable; '*': any). By "
    "default only 127.0.0.1, ::1 and localhost are answered (421 otherwise), which stops DNS "
    "rebinding; a server bound to another address needs the names clients reach it by.",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8000,
    show_default=True,
    help="Port to bind; 0 picks a free one (read it from --ready-file).",
)
@click.option(
    "--ready-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help='Once listening, atomically write {"url": ..., "pid": ...} here (removed on exit).',
)
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Initial weights are NumpyGRPOTrainer(seed=SEED)'s (version 0); also seeds requests "
    "that carry no seed.",
)
@click.option("--model-name", default=PolicyServer.DEFAULT_MODEL_NAME, show_default=True)
@click.option(
    "--call-latency-s",
    type=click.FloatRange(min=0.0),
    default=0.0,
    show_default=True,
    help="Seconds every generation waits before it answers (a request stays in flight).",
)
@click.option(
    "--token-latency-s",
    type=click.FloatRange(min=0.0),
    default=0.0,
    show_default=True,
    help="Seconds every generated token takes (a decode step). With it a call is generated "
    "token by token, so POST /pause?mode=keep stops it between tokens and weights loaded "
    "before POST /resume generate the rest (0: every token at once).",
)
@click.option(
    "--max-model-len",
    type=click.IntRange(min=2),
    default=512,
    show_default=True,
    help="Context length: prompt plus max_tokens.",
)
@click.option(
    "--exit-with-parent",
    is_flag=True,
    help="Stop (as on SIGTERM) when the process that started this one dies, so a killed job "
    "leaves no server behind.",
)
@click.option(
    "--parent-pid",
    type=click.IntRange(min=1),
    help="Stop when the process with this pid dies (the job that launched this server): "
    "also noticed when it dies before this server starts, or when another process "
    "restarts the server.",
)
@click.option(
    "--max-body-bytes",
    type=click.IntRange(min=0),
    default=_DEFAULTS.max_body_bytes,
    show_default=True,
    help="Largest request body (413 past it, before it is read).",
)
@click.option(
    "--max-inflight-body-bytes",
    type=click.IntRange(min=0),
    default=_DEFAULTS.max_inflight_body_bytes,
    show_default=True,
    help="Request bodies read or handled at once, all together: a request that would pass "
    "it is answered 503 before its body is read. At least --max-body-bytes.",
)
@click.option(
    "--max-connections",
    type=click.IntRange(min=1),
    default=_DEFAULTS.max_connections,
    show_default=True,
    help="Connections open at once (one thread each); more are answered 503 and closed.",
)
@click.option(
    "--keep-alive-timeout-s",
    type=click.FloatRange(min=0.0, min_open=True),
    default=_DEFAULTS.keep_alive_timeout_s,
    show_default=True,
    help="Close a connection idle this long (no request started).",
)
@click.option(
    "--read-timeout-s",
    type=click.FloatRange(min=0.0, min_open=True),
    default=_DEFAULTS.read_timeout_s,
    show_default=True,
    help="A whole request (line, headers, body) must arrive within this of its first byte, "
    "however it drips.",
)
@click.option(
    "--write-timeout-s",
    type=click.FloatRange(min=0.0, min_open=True),
    default=_DEFAULTS.write_timeout_s,
    show_default=True,
    help="A whole answer must be taken by the client within this.",
)
@click.option("--access-log", is_flag=True, help="Log every request to stderr.")
def serve(
    host: str,
    uds: str | None,
    remove_socket_dir: bool,
    api_key_env: str | None,
    allow_hosts: tuple[str, ...],
    port: int,
    ready_file: Path | None,
    seed: int,
    model_name: str,
    call_latency_s: float,
    token_latency_s: float,
    max_model_len: int,
    exit_with_parent: bool,
    parent_pid: int | None,
    max_body_bytes: int,
    max_inflight_body_bytes: int,
    max_connections: int,
    keep_alive_timeout_s: float,
    read_timeout_s: float,
    write_timeout_s: float,
    access_log: bool,
) -> None:
    """Serve the numpy policy over vLLM's HTTP API, token in and token out.

    Routes: /v1/completions, /v1/models, /inference/v1/generate, /health, /weight_info,
    /update_weight_version and /update_weights (load new weights; never an older version),
    /pause?mode=keep, /resume and /is_paused (calls in flight stop between tokens and go on
    under the weights loaded meanwhile).
    Prints "serving on URL" once listening; SIGTERM or SIGINT stops it (exit 0).
    POST bodies must be declared JSON (415), cross-origin requests are refused (403).
    """
    try:
        settings = ServeSettings(
            api_key=_api_key(api_key_env),
            allowed_hosts=allow_hosts,
            host=host,
            port=port,
            uds=uds,
            model_name=model_name,
            seed=seed,
            call_latency_s=call_latency_s,
            token_latency_s=token_latency_s,
            max_model_len=max_model_len,
            max_body_bytes=max_body_bytes,
            max_inflight_body_bytes=max_inflight_body_bytes,
            max_connections=max_connections,
            keep_alive_timeout_s=keep_alive_timeout_s,
            read_timeout_s=read_timeout_s,
            write_timeout_s=write_timeout_s,
            access_log=access_log,
        )
    except InvalidArgumentError as error:
        raise click.UsageError(str(error)) from None
    try:
        server = PolicyServer(settings)
    except OSError as error:
        where = uds if uds is not None else f"{host}:{port}"
        raise click.ClickException(f"cannot listen on {where}: {error.strerror or error}") from None
    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    if parent_pid is not None or exit_with_parent:
        _watch_parent(parent_pid if parent_pid is not None else os.getppid(), stop)
    try:
        server.start()
        if ready_file is not None:
            try:
                server.write_ready_file(ready_file)
            except OSError as error:
                raise click.ClickException(
                    f"cannot write the ready file {str(ready_file)!r}: {error.strerror or error}"
                ) from None
        if uds is None and host not in _LOOPBACK and api_key_env is None:
            click.echo(
                f"warning: serving on {host} without authentication (--api-key-env): anyone "
                "who can reach it can generate and replace the weights",
                err=True,
            )
        if uds is None and host not in _LOOPBACK and not allow_hosts:
            click.echo(
                f"note: serving on {host}, answering only requests for 127.0.0.1, ::1 or "
                "localhost; name the hosts clients reach it by with --allow-host",
                err=True,
            )
        click.echo(f"serving on {server.url}")
        sys.stdout.flush()
        # A timed wait: the signal handler runs between waits even where a blocking
        # wait would not be interrupted.
        while not stop.wait(1.0):
            pass
    finally:
        server.close()
        if ready_file is not None:
            _remove_own_ready_file(ready_file)
        if uds is not None and remove_socket_dir:
            with contextlib.suppress(OSError):  # another server's socket is still there
                Path(uds).parent.rmdir()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
