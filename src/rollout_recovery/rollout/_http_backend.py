"""The HTTP backend: agent episodes against OpenAI-compatible generation servers.

The episode is the one every backend runs (:func:`run_episode` over :class:`DigitTask`, or
the task the backend is given: the LLM job's "emit token X"); this module is its model
client. Token in, token out: an episode keeps token ids and never
re-renders text, so each call's prompt is the previous call's prompt + its generated ids +
a tag, and the capture writer refuses (before anything is sent) a prompt that does not
extend its parent. Every call is staged through the attempt's ``CaptureWriter`` before the
episode goes on, with its sampling parameters, logprob mode, server, the server's own
weight version and per-token version spans (where the dialect reports them) as the call's
extras.
The staged ``weight_version`` is the client-side stamp: the version the serving server had
confirmed when the call was dispatched.

Failures are classified:

- *infra* (connection refused or reset, HTTP 5xx, 408, 429, or no complete reply within
  ``request_timeout_s``: a total deadline on the whole exchange, not httpx's per-read
  timeout, so a server that drips one byte at a time cannot hold a call): the server is
  reported to the pool and the call is redispatched to another server after a backoff, up
  to ``call_redispatch_budget`` times; nothing of the call was acknowledged (a call is
  acknowledged only by its staged record), so resending it cannot double anything. When
  the budget is spent the attempt ends as an ``AttemptFailure`` (``server_unavailable``)
  and the controller abandons it and retries the sibling under its own round budget.
  401, 403 and 421 are infra too: a server that refuses this client (its key, its host
  name) refuses every call alike.
- *data*: the attempt ends as a *sealed failed attempt*: its receipt is poisoned with
  ``data_error:<reason>``, so the sibling trains as a masked placeholder that says why.
  Resending would not help: the same request gets the same refusal. Two kinds:

  - the request was refused (another 4xx, a context overflow): any server would refuse
    it, so it says nothing about the server;
  - the reply is unusable: not JSON of the dialect's shape, not UTF-8 or nested too deeply
    (``malformed_reply``), longer than the byte cap (``reply_too_large``: the body is
    streamed and the connection dropped at the cap, see ``max_reply_bytes``), a token id
    outside the trainer's vocabulary (``token_out_of_vocab``), ids, logprobs, echo or
    spans that disagree (``token_mismatch``, ``invalid_logprobs``, ``empty_generation``).
    These count against the server: ``dead_after_failures`` in a row and the pool takes
    it out of rotation (``server_bad_data``, see ``_server_pool.py``).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar, cast

import httpx

from .._http import ACCEPTED_ENCODINGS, WEIGHT_VERSION_HEADER, parse_version
from .._lifecycle import AsyncResource
from .._outcomes import FailureReason
from .._unix_http import ServerTransport
from ..capture import CaptureWriter, StagedPrefix
from ..errors import ConfigError, GenerationError
from ._config import GenerationConfig, HttpConfig
from ._episode import Completion, EpisodeTask, Sampling, run_episode
from ._protocol import AttemptFailure, AttemptRequest, AttemptResult
from ._server_pool import Lease, ServerPool, ServerStats
from ._server_url import bearer_headers
from ._weight_sync import WEIGHT_SYNCS, WeightSync
from ._wire import (
    DIALECTS,
    CallSpec,
    DataError,
    DataFailure,
    Dialect,
    ServerReply,
    error_message,
    error_payload,
    read_body,
)

__all__ = ["HttpGenerationBackend", "classify_status"]

Weights = TypeVar("Weights")

# Statuses that say "this server, now" rather than "this request": resend elsewhere.
# 401, 403 and 421 are a server that refuses this client (another key, another host
# name): every request would be refused alike, so they are the server's failure, never
# rows masked as bad data.
_INFRA_STATUSES = frozenset({401, 403, 408, 421, 429})
# vLLM 0.32's refusals of a prompt that leaves no room (tests/fixtures/vllm/error_*.json).
_CONTEXT_OVERFLOW_MARKERS = (
    "maximum context length",
    "maximum model length",
    "max_model_len",
    "max_tokens must be at least 1",
)
# How much of a data failure's detail (partly the server's words) an event keeps.
_EVENT_DETAIL_CHARS = 300
# How much of a server's own name for a weight version is quoted or recorded.
_NAMED_CHARS = 60
# The default reply cap: a generous multiple of what vLLM sends per token (about 150 bytes
# per generated token with its logprob entry, under 10 per echoed prompt id), plus room
# for the envelope.
REPLY_BASE_BYTES = 4 * 2**20
REPLY_BYTES_PER_MAX_TOKEN = 2**10
REPLY_BYTES_PER_PROMPT_ID = 64
# Attempts whose servers are remembered for ``blame_servers``: the newest this many, far
# more than a step's rows and the attempts in flight (a run keeps few steps of rows
# unconsumed), at a few hundred bytes each.
_TRACED_ATTEMPTS = 16_384


def _is_infra_status(status: int) -> bool:
    return status >= 500 or status in _INFRA_STATUSES


def classify_status(status: int, payload: object) -> DataFailure | None:
    """None for an infra status (resend elsewhere), else the data failure it means: the
    request's, not the server's (any server would refuse it)."""
    if _is_infra_status(status):
        return None
    message = error_message(payload)
    if any(marker in message.lower() for marker in _CONTEXT_OVERFLOW_MARKERS):
        return DataFailure(DataError.CONTEXT_OVERFLOW, message, blames_server=False)
    return DataFailure(DataError.HTTP_REFUSED, message, blames_server=False, status=status)


class _InfraFailure(Exception):
    pass


class HttpGenerationBackend(AsyncResource, Generic[Weights]):
    """Implements ``GenerationBackend[Weights]`` over the HTTP servers ``[http]`` names;
    ``Weights`` is what the weight sync pushes (``PolicySnapshot`` for
    ``rollout-recovery serve``, anything for a sync that ignores the weights).

    ``client`` may be given (tests pass one over ``httpx.MockTransport``); otherwise the
    backend makes its own and closes it in :meth:`aclose`. Either way the client carries
    ``api_key`` as ``Authorization: Bearer`` (calls, probes, weight pushes; never
    recorded). ``on_event(kind, server, detail)`` hears server state changes,
    redispatches and data failures, for the audit trail.
    """

    def __init__(
        self,
        http: HttpConfig,
        *,
        generation: GenerationConfig,
        episodes: EpisodeTask,
        vocab_size: int,
        initial_version: int,
        initial_weights: Weights,
        weight_sync: WeightSync[Weights] | None = None,
        sync_timeout_s: float | None = None,
        temperature: float = 1.0,
        api_key: str | None = None,
        stage_in_thread: bool = True,
        max_reply_bytes: int | None = None,
        client: httpx.AsyncClient | None = None,
        on_event: Callable[[str, str, dict[str, object]], None] | None = None,
    ) -> None:
        """The backend ``[http]`` and ``[generation]`` describe, running ``episodes`` (the
        digit task's, or the LLM job's "emit token X"): the one builder of the job, the
        LLM job and a Ray worker.

        ``vocab_size`` is the trainer's: a reply naming an id outside ``[0, vocab_size)``
        is a data failure at the wire, so no row the trainer would refuse is ever staged.
        ``weight_sync`` defaults to the one ``[http] weight_sync`` names (a sync that lives
        in another package, vLLM's, is passed in, with its own ``sync_timeout_s``).
        ``temperature`` is the trainer's: its ratio's denominator is the servers'
        logprob. ``max_reply_bytes`` caps every reply (``reply_too_large``); None:
        ``REPLY_BASE_BYTES`` + ``REPLY_BYTES_PER_MAX_TOKEN`` * max_tokens +
        ``REPLY_BYTES_PER_PROMPT_ID`` * prompt ids, per call.
        """
        if weight_sync is None:
            if http.weight_sync not in WEIGHT_SYNCS:
                raise ConfigError(
                    f"weight_sync = {http.weight_sync!r} needs its sync passed in "
                    "(the job builds it)",
                    path="$.http.weight_sync",
                )
            # The table's syncs take the numpy policy's snapshots or any weights; the job
            # refuses a trainer of other weights for "policy" before it gets here.
            weight_sync = cast("WeightSync[Weights]", WEIGHT_SYNCS[http.weight_sync])
        self._interrupt = generation.on_weight_update == "interrupt"
        self._http = http
        self._task = episodes
        self._dialect: Dialect = DIALECTS[http.dialect]
        self._vocab_size = vocab_size
        self._temperature = temperature
        self._stage_in_thread = stage_in_thread
        self._max_reply_bytes = max_reply_bytes
        self._own_client = client is None
        # Its own client reaches launched servers on their Unix sockets too (_unix_http).
        self._client = (
            client if client is not None else httpx.AsyncClient(transport=ServerTransport())
        )
        self._client.headers.update(bearer_headers(api_key))
        # Only what read_capped inflates under its cap (httpx would offer br and zstd).
        self._client.headers["Accept-Encoding"] = ACCEPTED_ENCODINGS
        # Bounded: a caller that never drains must not grow memory without end.
        self._events: collections.deque[dict[str, Any]] = collections.deque(maxlen=10_000)
        self._listener = on_event
        self._pool = ServerPool(
            http,
            weight_sync=weight_sync,
            client=self._client,
            interrupt=self._interrupt,
            sync_timeout_s=sync_timeout_s,
            on_event=self._on_event,
        )
        # Recorded, not pushed: the backend may be built inside the running loop, before
        # a restore sets the restored weights; the first probes sync every server.
        self._pool.set_weights(initial_version, initial_weights, push=False)
        self.redispatches = 0
        self.data_failures: dict[str, int] = {}
        # Rollout id -> the servers that answered its calls (the last call's last), newest
        # attempt last.
        self._servers_of: collections.OrderedDict[str, list[str]] = collections.OrderedDict()

    def _reply_cap(self, call: CallSpec) -> int:
        """How many bytes of ``call``'s reply are read at most."""
        if self._max_reply_bytes is not None:
            return self._max_reply_bytes
        return (
            REPLY_BASE_BYTES
            + REPLY_BYTES_PER_MAX_TOKEN * call.max_tokens
            + REPLY_BYTES_PER_PROMPT_ID * len(call.prompt_token_ids)
        )

    # -- introspection -----------------------------------------------------------------------

    @property
    def pool(self) -> ServerPool[Weights]:
        return self._pool

    def server_stats(self) -> dict[str, ServerStats]:
        return self._pool.stats()

    def _on_event(self, kind: str, server: str, detail: dict[str, object]) -> None:
        self._events.append({"event": kind, "server": server, **detail})
        if self._listener is not None:
            self._listener(kind, server, detail)

    # -- BackendTelemetry --------------------------------------------------------------------

    def drain_events(self) -> list[dict[str, Any]]:
        """Server state changes, weight loads, redispatches and data failures since the
        last drain."""
        events = list(self._events)
        self._events.clear()
        return events

    def telemetry(self) -> dict[str, Any]:
        """Per-server counts and states, and the backend's redispatch and data-failure counts."""
        states = self._pool.states()
        return {
            "servers": {
                url: {"state": states[url], **dataclasses.asdict(stats)}
                for url, stats in self._pool.stats().items()
            },
            "redispatches": self.redispatches,
            "data_failures": dict(self.data_failures),
        }

    def _answered(self, rollout_id: str, url: str) -> None:
        """Remember that ``url`` answered a call of attempt ``rollout_id`` (bounded)."""
        servers = self._servers_of.setdefault(rollout_id, [])
        if url in servers:
            servers.remove(url)
        servers.append(url)
        self._servers_of.move_to_end(rollout_id)
        while len(self._servers_of) > _TRACED_ATTEMPTS:
            self._servers_of.popitem(last=False)

    def blame_servers(
        self, guilty: Sequence[str], *, cleared: Sequence[str], step: int
    ) -> tuple[list[str], int]:
        """The trainer refused a step at ``step``: the rows of ``guilty`` rollout ids carry
        another model's logprobs, those of ``cleared`` its own. Each server that answered
        a call of a guilty row is marked as the pool marks a server caught lying about its
        weights (dead, quarantined), but one that alone answered a cleared row: a row's
        calls may go to several servers, and an honest one shares the guilty rows of a
        liar it was mixed with. Returns the servers blamed and how many guilty rows could
        not be traced (their attempt ran before a restart, or longer ago than the newest
        16,384 attempts). Calls an attempt inherited from an earlier one (call-level
        resume) are not traced: only the servers of the attempt's own calls are blamed."""
        honest: set[str] = set()
        for rollout_id in cleared:
            answered = self._servers_of.get(rollout_id, [])
            if len(answered) == 1:
                honest.add(answered[0])
        rows_of: dict[str, int] = {}
        untraced = 0
        for rollout_id in guilty:
            answered = self._servers_of.get(rollout_id, [])
            if not answered:
                untraced += 1
            for url in set(answered) - honest:
                rows_of[url] = rows_of.get(url, 0) + 1
        for url, rows in sorted(rows_of.items()):
            self._pool.blame(url, step=step, rows=rows)
        return sorted(rows_of), untraced

    # -- GenerationBackend -------------------------------------------------------------------

    def update_weights(self, version: int, weights: Weights) -> None:
        """New trainer weights: pushed to every server in the background; each call is
        stamped with the version its server had confirmed at dispatch."""
        self._pool.set_weights(version, weights)

    async def aclose(self) -> None:
        await self._pool.aclose()
        if self._own_client:
            await self._client.aclose()

    async def run_attempt(
        self,
        request: AttemptRequest,
        capture: CaptureWriter,
        prefix: StagedPrefix | None = None,
    ) -> AttemptResult | AttemptFailure:
        """One episode, continuing ``prefix``'s staged calls if given.

        Every server of a call failing, no live server, a closed backend: an
        ``AttemptFailure``, converted by the episode from the pool's ``GenerationError``.
        """
        if self._pool.closed:  # before the prefix is staged again
            return AttemptFailure.closed(request, "HTTP")
        return await run_episode(
            request,
            capture,
            task=self._task,
            client=_HttpClient(self, request),
            prefix=prefix,
            stage_in_thread=self._stage_in_thread,
        )

    # -- one call ------------------------------------------------------------------------------

    async def _generate(
        self, request: AttemptRequest, prompt_ids: Sequence[int], call_id: str, sampling: Sampling
    ) -> Completion:
        call = CallSpec(
            prompt_token_ids=list(prompt_ids),
            max_tokens=sampling.max_tokens,
            temperature=self._temperature,
        )
        try:
            answered = self._servers_of.get(request.rollout_id)
            prefer = answered[-1] if answered else None
            lease, reply, redispatches = await self._call(request, call, call_id, prefer)
        except DataFailure as failure:
            self.data_failures[failure.code] = self.data_failures.get(failure.code, 0) + 1
            raise
        self._answered(request.rollout_id, lease.url)
        extras: dict[str, Any] = {
            "server": lease.url,
            "endpoint": self._dialect.path,
            "sampling_params": call.sampling_params(),
            "logprob_mode": self._http.logprob_mode,
            "dispatch_weight_version": request.weight_version,
            "server_weight_version": reply.server_weight_version,
            "weight_version_spans": reply.weight_version_spans,
            "finish_reason": reply.finish_reason,
            "redispatches": redispatches,
        }
        version = lease.version if lease.version is not None else request.weight_version
        if self._interrupt:
            # Weights may have been loaded under the call: its tokens are the spans'
            # versions (checked in _send), and the call is stamped with its newest.
            version = _span_versions(reply)[-1]
        return Completion(
            token_ids=reply.token_ids,
            logprobs=reply.logprobs,
            # The client-side stamp: the version the server had confirmed at dispatch.
            weight_version=version,
            extras=extras,
        )

    async def _call(
        self, request: AttemptRequest, call: CallSpec, model_call_id: str, prefer: str | None
    ) -> tuple[Lease, ServerReply, int]:
        """Send ``call`` to a healthy server (``prefer`` where it can: the attempt's last),
        redispatching infra failures elsewhere."""
        tried: set[str] = set()
        last_error = ""
        budget = self._http.call_redispatch_budget
        for redispatch in range(budget + 1):
            if redispatch:
                self.redispatches += 1
                await asyncio.sleep(self._http.redispatch_backoff_s * 2 ** (redispatch - 1))
            # The attempt's dispatch version is the oldest its calls may be generated by:
            # a server lagging behind a push it prepares may still serve them.
            lease = await self._pool.acquire(
                avoid=tried, prefer=prefer, floor=request.weight_version
            )
            outcome, why = "infra", ""
            try:
                reply = await self._send(lease, call)
                outcome = "ok"
                return lease, reply, redispatch
            except _InfraFailure as error:
                tried.add(lease.url)
                last_error = str(error)
                self._on_event(
                    "call_redispatched" if redispatch < budget else "call_failed",
                    lease.url,
                    {"rollout_id": request.rollout_id, "call": model_call_id, "error": last_error},
                )
            except DataFailure as failure:
                outcome, why = ("bad_data" if failure.blames_server else "data"), failure.code
                self._on_event(
                    "call_data_failed",
                    lease.url,
                    {
                        "rollout_id": request.rollout_id,
                        "call": model_call_id,
                        "reason": failure.code,
                        # A server writes the detail: bounded, as every event line is.
                        "detail": failure.detail[:_EVENT_DETAIL_CHARS],
                    },
                )
                raise
            except asyncio.CancelledError:
                # The controller's deadline or a shutdown, not the server's failure.
                outcome = "cancelled"
                raise
            finally:
                await self._pool.release(lease, outcome=outcome, reason=why)
        raise GenerationError(
            FailureReason.SERVER_UNAVAILABLE,
            f"call {model_call_id} failed on {len(tried)} server(s) after {budget} "
            f"redispatches: {last_error}",
            worker=None,
        )

    async def _send(self, lease: Lease, call: CallSpec) -> ServerReply:
        body = self._dialect.body(self._http.model, call)
        timeout = self._http.request_timeout_s
        try:
            # The whole exchange under one deadline: httpx's timeout bounds each read
            # only, and a server that drips a byte per read would hold the call for ever.
            async with asyncio.timeout(timeout):
                async with self._client.stream(
                    "POST", lease.url + self._dialect.path, json=body, timeout=timeout
                ) as response:
                    status = response.status_code
                    if _is_infra_status(status):  # the body says nothing we act on
                        raise _InfraFailure(f"{lease.url}: HTTP {status}")
                    header = response.headers.get(WEIGHT_VERSION_HEADER)
                    # Streamed under a cap: leaving this block early drops the connection.
                    raw = await read_body(response, self._reply_cap(call))
        except TimeoutError:
            raise _InfraFailure(f"{lease.url}: no complete reply within {timeout} s") from None
        except httpx.HTTPError as error:  # refused, reset, timed out, protocol broken
            raise _InfraFailure(f"{lease.url}: {type(error).__name__}: {error}") from error
        if status != 200:
            failure = classify_status(status, error_payload(raw))
            if failure is None:
                raise _InfraFailure(f"{lease.url}: HTTP {status}")
            raise failure
        reply = self._dialect.parse(call, raw, vocab_size=self._vocab_size)
        if header is not None and reply.server_weight_version is None:
            reply = dataclasses.replace(reply, server_weight_version=header[:_NAMED_CHARS])
        if self._pool.tracks_versions:
            # A DataFailure here counts against the server, which is no longer trusted.
            _check_named_versions(
                _named_versions(reply, header),
                confirmed=lease.version,
                newest=self._pool.newest_version,
            )
        if self._interrupt:
            _span_versions(reply)
        return reply


def _named_versions(reply: ServerReply, header: str | None) -> list[object]:
    """Every weight version a reply names for its tokens: its spans' (vLLM's generate
    route), else its own field (SGLang), and the ``X-Weight-Version`` header (serve)."""
    named: list[object] = [span["version"] for span in reply.weight_version_spans or []]
    if not named and reply.server_weight_version is not None:
        named.append(reply.server_weight_version)
    if header is not None:
        named.append(header)
    return named


def _check_named_versions(
    named: list[object], *, confirmed: int | None, newest: int | None
) -> None:
    """Refuse a reply whose tokens a server says came from weights it cannot have given
    them: a version that is none of ours or later than the trainer's newest
    (``unversioned_tokens``), or older than the one the server confirmed loading before
    the call was sent (``weight_version_mismatch``: it acknowledged a push it never
    loaded). A server's push may land during a call, so a version between the two is
    its word, and the call keeps the stamp of what was confirmed at dispatch."""
    for name in named:
        version = parse_version(name)
        if version is None or (newest is not None and version > newest):
            shown = repr(name)[:_NAMED_CHARS]
            raise DataFailure(
                DataError.UNVERSIONED_TOKENS,
                f"the reply names weight version {shown}, which this job never had "
                f"(its newest is {newest})",
            )
        if confirmed is not None and version < confirmed:
            raise DataFailure(
                DataError.WEIGHT_VERSION_MISMATCH,
                f"the reply names weight version {version}, older than the version "
                f"{confirmed} the server confirmed loading before the call",
            )


def _span_versions(reply: ServerReply) -> list[int]:
    """The versions of a reply's spans, oldest first: every one must name one of our
    versions (checked against the pool's in ``_send``) and none may go backwards (a span
    we cannot place would stamp tokens with weights we cannot name)."""
    spans = reply.weight_version_spans
    if not spans:
        raise DataFailure(
            DataError.UNVERSIONED_TOKENS,
            "the reply has no weight_versions spans",
            blames_server=True,
        )
    versions = [parse_version(span["version"]) for span in spans]
    known = [v for v in versions if v is not None]
    if len(known) != len(versions) or known != sorted(known):
        shown = [span["version"] for span in spans][:8]
        raise DataFailure(
            DataError.UNVERSIONED_TOKENS,
            f"weight_versions spans name versions {shown} (not all ours, or going backwards)",
            blames_server=True,
        )
    return known


class _HttpClient:
    """The model client of one attempt: its calls carry the attempt's dispatch stamp."""

    def __init__(self, backend: HttpGenerationBackend[Any], request: AttemptRequest) -> None:
        self._backend = backend
        self._request = request

    async def generate(
        self, prompt_ids: Sequence[int], *, call_id: str, sampling: Sampling
    ) -> Completion:
        return await self._backend._generate(self._request, prompt_ids, call_id, sampling)
