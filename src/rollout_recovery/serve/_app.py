"""The API: routes and what each answers, free of any transport.

:meth:`ServeApp.handle` maps ``(method, path, body bytes, headers)`` to a :class:`Response`;
the HTTP layer only reads requests and writes answers, so every route can be exercised
without a socket and the transport can change without touching the API. What can be judged
from the method, path and headers alone (who may ask, which route, a JSON body) is
:meth:`ServeApp.refusal`, which the transport asks before it reads a body.
"""

from __future__ import annotations

import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import msgspec
import numpy as np

from .. import __version__
from .._http import WEIGHT_VERSION_HEADER
from .._lifecycle import Resource
from ..policy import PolicySnapshot
from ._api_error import ApiError, bad_request, shown
from ._guard import RequestGuard
from ._limits import BodyLimit, body_limit
from ._pause import PauseGate
from ._requests import (
    SamplingRequest,
    decode_json_object,
    parse_completion_request,
    parse_generate_request,
)
from ._responses import completion_body, generate_body, models_body, version_label
from ._sampling import Generation, generate, generation_of
from ._settings import ServeSettings
from ._weights import WeightStore, parse_version_label, parse_weight_update

__all__ = ["WEIGHT_VERSION_HEADER", "Response", "ServeApp"]


@dataclass(frozen=True, slots=True)
class Response:
    """An answer: status, body bytes, extra headers; ``close`` ends the connection after it."""

    status: int
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    close: bool = False

    @property
    def content_type(self) -> str | None:
        return "application/json" if self.body else None


def _json(payload: Mapping[str, Any], *, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    return Response(HTTPStatus.OK, msgspec.json.encode(payload), headers)


# A handler gets the body and the query string's parameters (each name's last value).
_Handler = Callable[["ServeApp", bytes, Mapping[str, str]], Response]


class ServeApp(Resource):
    """The routes of one server over its :class:`WeightStore`.

    A generation request waits while the server is paused, takes its weight snapshot,
    calls ``on_admitted`` (a test seam: tests hold a request in flight with it, without
    sleeping), waits ``settings.call_latency_s`` (cut short with a 503 when the server
    stops), then samples: at once, or with ``settings.token_latency_s`` token by token,
    stopping between tokens while the server is paused (``/pause?mode=keep``) and taking
    the current weights again after a pause. ``on_token(position)`` is a test seam called
    after each paced token.
    """

    def __init__(
        self,
        settings: ServeSettings,
        weights: WeightStore,
        *,
        stopping: threading.Event,
        on_admitted: Callable[[], None] | None = None,
        on_token: Callable[[int], None] | None = None,
    ) -> None:
        self._settings = settings
        self._weights = weights
        self._stopping = stopping
        self._on_admitted = on_admitted
        self._on_token = on_token
        self._gate = PauseGate()
        self._guard = RequestGuard(api_key=settings.api_key, allowed_hosts=settings.allowed_hosts)
        self._created = int(time.time())
        # Requests without a seed draw from one seed sequence per server.
        self._seeds = np.random.SeedSequence(settings.seed)
        self._seeds_lock = threading.Lock()

    # -- dispatch ---------------------------------------------------------------------------

    def _admit(self, method: str, path: str, headers: Sequence[tuple[str, str]]) -> _Handler:
        """The route's handler, or the :class:`ApiError` that refuses the request.

        ``HEAD`` of a ``GET`` route is that route (the transport drops the body).
        """
        self._guard.check_headers(headers)
        methods = _ROUTES.get(path)
        if methods is None:
            raise ApiError(HTTPStatus.NOT_FOUND, f"no route {path}")
        handler = methods.get("GET" if method == "HEAD" and "GET" in methods else method)
        if handler is None:
            allow = ", ".join(sorted(methods))
            raise ApiError(
                HTTPStatus.METHOD_NOT_ALLOWED,
                f"{method} is not allowed on {path} (allowed: {allow})",
                headers=(("Allow", allow),),
            )
        if method == "POST":
            self._guard.check_content_type(headers)
        return handler

    def refusal(
        self, method: str, path: str, headers: Sequence[tuple[str, str]]
    ) -> Response | None:
        """The answer that refuses this request before its body is read, or None.

        ``headers`` are (name, value) pairs as received (names in any case, repeats kept).
        """
        try:
            self._admit(method, path, headers)
        except ApiError as error:
            return Response(error.status, error.body(), error.headers, error.close)
        return None

    def body_limit(self, path: str) -> BodyLimit:
        """What a body of ``path`` may be (``_limits``): the transport refuses a longer
        one before reading it, :meth:`handle` one of more JSON values before decoding it."""
        return body_limit(self._settings, path)

    def handle(
        self,
        method: str,
        path: str,
        body: bytes,
        headers: Sequence[tuple[str, str]],
        query: str = "",
    ) -> Response:
        """Answer one request; every refusal is vLLM's error body with its status.

        ``query`` is the URL's query string (without ``?``); only ``/pause`` reads it.
        """
        try:
            handler = self._admit(method, path, headers)
            self.body_limit(path).check_values(body, path)
            params = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
            return handler(self, body, params)
        except ApiError as error:
            return Response(error.status, error.body(), error.headers, error.close)

    def close(self) -> None:
        """Shutdown: release every request waiting out a pause (they answer 503)."""
        self._gate.close()

    # -- generation -------------------------------------------------------------------------

    @staticmethod
    def _shutting_down() -> ApiError:
        return ApiError(HTTPStatus.SERVICE_UNAVAILABLE, "the server is shutting down", close=True)

    def _wait(self, seconds: float) -> None:
        if seconds > 0 and self._stopping.wait(seconds):
            raise self._shutting_down()

    def _wait_running(self) -> int:
        """Wait out a pause; the number of pauses ended so far."""
        resumes, closed = self._gate.wait_running()
        if closed or self._stopping.is_set():
            raise self._shutting_down()
        return resumes

    def _rng(self, seed: int | None) -> np.random.Generator:
        if seed is not None:
            return np.random.default_rng(seed)
        with self._seeds_lock:
            (child,) = self._seeds.spawn(1)
        return np.random.default_rng(child)

    def _generate(self, request: SamplingRequest) -> tuple[Generation, tuple[tuple[str, str]]]:
        # The snapshot is taken at admission and kept: a weight update never changes which
        # policy produces a request's tokens, unless the request was paused in between
        # (/pause?mode=keep): then it goes on under the weights current at /resume.
        resumes = self._wait_running()
        snapshot: PolicySnapshot = self._weights.current()
        if self._on_admitted is not None:
            self._on_admitted()
        self._wait(self._settings.call_latency_s)
        if self._settings.token_latency_s > 0:
            generation = self._generate_by_token(request, snapshot, resumes)
        else:
            if self._wait_running() != resumes:
                snapshot = self._weights.current()
            generation = generate(
                snapshot,
                request.prompt,
                digit=request.digit,
                max_tokens=request.max_tokens,
                rng=self._rng(request.seed),
                top_k=request.top_k,
                ignore_eos=request.ignore_eos,
            )
        # Every generation answer names the weight version that produced it (the /v1
        # bodies cannot: vLLM's shapes have no field for it); clients check it.
        return generation, ((WEIGHT_VERSION_HEADER, version_label(generation.weight_version)),)

    def _generate_by_token(
        self, request: SamplingRequest, snapshot: PolicySnapshot, resumes: int
    ) -> Generation:
        """One decode step per token: wait ``token_latency_s``, wait out a pause (taking
        the current weights after one), sample the token from the snapshot held."""
        rng = self._rng(request.seed)
        tokens: list[int] = []
        logprobs: list[float] = []
        used: list[PolicySnapshot] = []
        for position in range(request.max_tokens):
            self._wait(self._settings.token_latency_s)
            now = self._wait_running()
            if now != resumes:
                resumes, snapshot = now, self._weights.current()
            drawn = snapshot.sample_next(request.prompt, tokens, rng)
            if drawn is None:
                break
            tokens.append(drawn[0])
            logprobs.append(drawn[1])
            used.append(snapshot)
            if self._on_token is not None:
                self._on_token(position)
        return generation_of(
            request.prompt,
            tokens,
            logprobs,
            used,
            digit=request.digit,
            top_k=request.top_k,
            ignore_eos=request.ignore_eos,
            last=snapshot,
        )

    def _completions(self, body: bytes, query: Mapping[str, str]) -> Response:
        request = parse_completion_request(
            decode_json_object(body),
            model_name=self._settings.model_name,
            max_model_len=self._settings.max_model_len,
        )
        generation, headers = self._generate(request)
        payload = completion_body(
            request_id=f"cmpl-{uuid.uuid4().hex[:16]}",
            created=int(time.time()),
            model=self._settings.model_name,
            request=request,
            generation=generation,
        )
        return _json(payload, headers=headers)

    def _inference_generate(self, body: bytes, query: Mapping[str, str]) -> Response:
        request, request_id = parse_generate_request(
            decode_json_object(body),
            model_name=self._settings.model_name,
            max_model_len=self._settings.max_model_len,
        )
        generation, headers = self._generate(request)
        payload = generate_body(
            request_id=f"generate-tokens-{request_id or uuid.uuid4().hex[:16]}",
            created=int(time.time()),
            model=self._settings.model_name,
            request=request,
            generation=generation,
        )
        return _json(payload, headers=headers)

    # -- models, health, weights ------------------------------------------------------------

    def _health(self, body: bytes, query: Mapping[str, str]) -> Response:
        return Response(HTTPStatus.OK)

    def _models(self, body: bytes, query: Mapping[str, str]) -> Response:
        return _json(
            models_body(
                model=self._settings.model_name,
                created=self._created,
                max_model_len=self._settings.max_model_len,
            )
        )

    def _version(self, body: bytes, query: Mapping[str, str]) -> Response:
        return _json({"version": __version__})

    def _weight_info(self, body: bytes, query: Mapping[str, str]) -> Response:
        return _json({"weight_version": version_label(self._weights.current().version)})

    def _update_weight_version(self, body: bytes, query: Mapping[str, str]) -> Response:
        version = parse_version_label(decode_json_object(body).get("new_version"))
        snapshot = self._weights.relabel(version)
        return _json({"success": True, "new_version": version_label(snapshot.version)})

    def _update_weights(self, body: bytes, query: Mapping[str, str]) -> Response:
        snapshot = parse_weight_update(decode_json_object(body))
        self._weights.load(snapshot)
        return _json({"weight_version": version_label(snapshot.version)})

    # -- pausing (vLLM's RL routes) -----------------------------------------------------------

    def _pause(self, body: bytes, query: Mapping[str, str]) -> Response:
        mode = query.get("mode")
        if mode != "keep":
            # vLLM's default is "abort" (and "wait" drains): neither is served here, and a
            # pause that silently did something else would corrupt a caller's spans.
            raise bad_request(
                f"mode must be 'keep' (requests in flight stop between tokens and keep their "
                f"state until /resume); got {shown(mode)}",
                param="mode",
            )
        clear_cache = query.get("clear_cache", "true").lower()
        if clear_cache not in ("true", "false", "1", "0"):
            raise bad_request(
                f"clear_cache must be true or false, got {shown(clear_cache)}", param="clear_cache"
            )
        self._gate.pause()  # no cache to clear: every token reads the snapshot's tables
        return _json({"status": "paused"})

    def _resume(self, body: bytes, query: Mapping[str, str]) -> Response:
        self._gate.resume()
        return _json({"status": "resumed"})

    def _is_paused(self, body: bytes, query: Mapping[str, str]) -> Response:
        return _json({"is_paused": self._gate.paused})


_ROUTES: dict[str, dict[str, _Handler]] = {
    "/health": {"GET": ServeApp._health},
    "/version": {"GET": ServeApp._version},
    "/v1/models": {"GET": ServeApp._models},
    "/v1/completions": {"POST": ServeApp._completions},
    "/inference/v1/generate": {"POST": ServeApp._inference_generate},
    "/weight_info": {"GET": ServeApp._weight_info},
    "/update_weight_version": {"POST": ServeApp._update_weight_version},
    "/update_weights": {"POST": ServeApp._update_weights},
    "/pause": {"POST": ServeApp._pause},
    "/resume": {"POST": ServeApp._resume},
    "/is_paused": {"GET": ServeApp._is_paused},
}
