"""The fleet of generation servers: health, weight versions, and who gets the next call.

Each server moves through these states::

    joining --probe ok + current weights--> healthy
    healthy --a failed call or probe, or a bad reply--> suspect --probe ok--> healthy
    suspect --dead_after_failures in a row--> dead
    dead --probe ok--> recovering --reports the current version--> healthy ("rejoined")

Only *healthy* servers get calls, each at most ``concurrency`` at a time; among them the
server of the attempt's previous call wins if it is free (a row is one server's, so a
refused row names its server), else the least loaded, and a call being redispatched avoids
the servers it already failed on.
Failures of real calls count as much as failed probes, because a wedged engine may still
answer its liveness route. A server that comes back (or a new one) gets traffic again only
once it reports the trainer's current weight version: it never serves stale weights under
a new stamp.

With an *exclusive* weight sync (a server that may switch weights under a call in flight,
as vLLM does) a push to a server has three parts. First the sync's local work for the
version (:class:`PreparingWeightSync`: vLLM's weights file, written once for every
server); meanwhile the server keeps taking the calls the staleness policy lets the
version it holds serve: a call's ``floor`` is the version its attempt was dispatched at
(the controller's newest when its round started), and a server that holds the version
the new one replaced serves calls whose floor is at most that. With ``staleness_window
= 0`` every new call's floor is the newest version, so none goes to it; with a window
the push's file is written while generation goes on. Then the server takes no new call
and the push starts once its calls in flight have ended (their tokens all come from the
version they are stamped with), and it takes calls again once it reports the new
version. A restore sets the restored weights before anything is dispatched, so no call
reaches a server before it holds them (every call after it is dispatched at the restored
version or a later one: its floor). With
``on_weight_update = "interrupt"`` none of that waiting happens: a push pauses the
server's calls between tokens, loads and resumes them (``InterruptingWeightSync``), and a
server whose push is pending still takes calls.

Bad replies (a data failure the server is to blame for: garbage, an oversize body, ids
outside the vocabulary, a reply that disagrees with itself) count on their own streak,
which only a good reply resets, since a server that answers garbage still answers its
probes. ``dead_after_failures`` in a row and the server is dead (``server_bad_data``)
and quarantined: no probe revives it for ``bad_data_quarantine_s``; then it rejoins like
any dead server, on probation (its streak stands, so one more bad reply and it is out
again).

A server's word on its weights is checked against what it confirmed: every probe asks
``/weight_info`` (a server without the route is not asked again), and the backend checks
the versions each reply names (``X-Weight-Version``, vLLM's spans). A server that names
weights older than it confirmed, or a version the job never had, is *untrusted*: the
call's reply is not used, what it confirmed is forgotten (it must be synced again before
it is current), and it is dead and quarantined at once (``server_bad_data``), since a
server that acknowledges pushes it never loads still answers everything else. So is a
server the trainer caught answering another model's logprobs (``blame``,
``server_logprob_mismatch``). A probe that returns after its server was quarantined
vouches for nothing.

Every exchange has a total deadline, not only httpx's per-read timeout: a probe
``probe_timeout_s``, a weight push ``sync_timeout_s``. Deadlines and quarantines are on
the event loop's clock (``_clock.monotonic``), the one ``asyncio.timeout`` reads, so a test
on a virtual clock controls all of them. Each server is probed by its own
task (every ``probe_interval_s``), which also starts weight pushes to a server that lags
behind, so one server that stalls its probes never delays another's probe or rejoin.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import httpx
import msgspec

from .._clock import monotonic
from .._http import parse_version
from .._lifecycle import AsyncResource
from .._outcomes import FailureReason
from .._workers import Worker, WorkerHealth, WorkerPool, least_loaded
from ..errors import GenerationError, InvalidArgumentError
from ._config import HttpConfig
from ._weight_sync import (
    InterruptingWeightSync,
    PreparingWeightSync,
    TimedWeightSync,
    WeightSync,
)
from ._wire import DataError, DataFailure, read_body

__all__ = ["ServerPool", "ServerStats"]

Weights = TypeVar("Weights")

# What a probe reads of a /health body at most (vLLM's is empty): enough to reuse the
# connection, never a server's idea of a large reply.
_PROBE_BODY_CAP = 64 * 2**10
# A server whose rows' logprobs the trainer proved another model's (``blame``).
_LOGPROB_MISMATCH = "logprob_mismatch"
# Bad replies that are a server's word on its weights proven wrong: no streak needed.
_UNTRUSTED_REASONS = frozenset(
    {DataError.WEIGHT_VERSION_MISMATCH, DataError.UNVERSIONED_TOKENS, _LOGPROB_MISMATCH}
)
# How much of a server's own version string an event quotes.
_NAMED_CHARS = 60
# The most of a failure's text an event carries: an httpx error quotes the server's reason
# phrase and Location header (up to ~100 KB of a hostile reply), and events are journaled.
_WHY_CHARS = 300
# A probe that did not ask /weight_info (or got no answer from a server without it).
_NOT_ASKED = object()


class _WeightInfo(msgspec.Struct):
    weight_version: object = None
    version: object = None


def _closed_error() -> GenerationError:
    return GenerationError(FailureReason.BACKEND_CLOSED, "the HTTP backend is closed")


@dataclass(slots=True)
class ServerStats:
    """Per-server counts, for the summary table and ``metrics.jsonl``."""

    calls: int = 0
    infra_failures: int = 0
    data_failures: int = 0
    deaths: int = 0
    rejoins: int = 0
    weight_pushes: int = 0


@dataclass(eq=False, slots=True, kw_only=True)
class _Server(Worker):
    """A server in the pool (its name is its url): health and load are the pool's."""

    failures_in_a_row: int = 0
    bad_replies_in_a_row: int = 0  # reset by a good reply only, never by a probe
    quarantined_until: float = 0.0  # on the loop's clock; no revival before
    version: int | None = None  # what the server last reported holding
    syncing: bool = False
    draining: bool = False  # its push is past the sync's local work: no new call at all
    pushes_started: int = 0  # a probe's /weight_info is void if a push began meanwhile
    pushes_failed_in_a_row: int = 0  # reset by a push that loaded; only the first reports
    weight_info: bool = True  # False: it has no /weight_info route (not asked again)
    stats: ServerStats = field(default_factory=ServerStats)

    @property
    def url(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class Lease:
    """One call's hold on a server; the version is the client-side stamp at dispatch."""

    url: str
    version: int | None


class ServerPool(AsyncResource, Generic[Weights]):
    """Tracks ``urls``; see the module docstring. Use from one event loop. ``Weights`` is
    what ``weight_sync`` pushes."""

    def __init__(
        self,
        http: HttpConfig,
        *,
        weight_sync: WeightSync[Weights],
        client: httpx.AsyncClient,
        interrupt: bool = False,
        sync_timeout_s: float | None = None,
        on_event: Callable[[str, str, dict[str, object]], None] = lambda *_: None,
    ) -> None:
        """The servers of ``[http] servers``, judged and loaded as ``[http]`` says.

        ``interrupt`` (``[generation] on_weight_update = "interrupt"``): a push pauses a
        server's calls between tokens, loads and resumes them, so ``weight_sync`` must be
        an ``InterruptingWeightSync``. ``sync_timeout_s`` replaces ``[http]``'s for a sync
        with a deadline of its own (vLLM's loads take longer).
        """
        urls = [url.rstrip("/") for url in http.servers]
        if not urls:
            # The job fills [http] servers with the servers it launches before it builds
            # the pool; an empty pool would fail every call after no_server_wait_s.
            raise InvalidArgumentError("at least one server url is needed", path="$.http.servers")
        if interrupt and not isinstance(weight_sync, InterruptingWeightSync):
            raise InvalidArgumentError(
                f"the {weight_sync.name!r} weight sync cannot load weights under calls in "
                'flight: on_weight_update = "interrupt" needs "policy" or "vllm"',
                path="$.generation.on_weight_update",
            )
        self._interrupt = interrupt
        self._workers: WorkerPool[_Server] = WorkerPool(closed_error=_closed_error)
        for url in urls:
            self._workers.add(_Server(name=url, capacity=http.per_server_concurrency))
        self._http = http
        self._sync_timeout_s = http.sync_timeout_s if sync_timeout_s is None else sync_timeout_s
        self._sync = weight_sync
        self._client = client
        self._on_event = on_event
        self._target: tuple[int, Weights] | None = None
        # The version the newest one replaced (None after a restore or a first version):
        # a server holding it still serves calls dispatched at it while its push prepares.
        self._previous: int | None = None
        self._started = False

    # -- introspection ---------------------------------------------------------------------

    def states(self) -> dict[str, str]:
        return {url: server["health"] for url, server in self._workers.snapshot().items()}

    def stats(self) -> dict[str, ServerStats]:
        return {server.url: server.stats for server in self._workers}

    def versions(self) -> dict[str, int | None]:
        return {server.url: server.version for server in self._workers}

    @property
    def tracks_versions(self) -> bool:
        """Whether servers report the weights they hold (the sync tracks versions)."""
        return self._sync.tracks_versions

    @property
    def newest_version(self) -> int | None:
        """The trainer's newest weight version: no server can hold a later one."""
        return None if self._target is None else self._target[0]

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Start one probe loop per server (idempotent; needs a running loop)."""
        if self._started or self._workers.closed:
            return
        self._started = True
        for server in self._workers:
            self._workers.spawn(self._probe_loop(server), f"probe-{server.url}")

    @property
    def closed(self) -> bool:
        return self._workers.closed

    async def aclose(self) -> None:
        await self._workers.aclose()

    def _move(self, server: _Server, state: WorkerHealth, **detail: object) -> None:
        previous = self._workers.mark(server, state)
        if previous is None:
            return
        if state is WorkerHealth.DEAD:
            server.stats.deaths += 1
        if state is WorkerHealth.HEALTHY and previous is WorkerHealth.RECOVERING:
            server.stats.rejoins += 1
        self._on_event(
            "server_state", server.url, {"from": previous.value, "to": state.value, **detail}
        )

    # -- weights ---------------------------------------------------------------------------

    def set_weights(self, version: int, weights: Weights, *, push: bool = True) -> None:
        """The trainer's new weights: every reachable server gets them in the background.
        ``push=False`` only records them (a backend's initial weights, which a restore may
        replace before the servers are probed: pushing them would load weights the job
        then throws away)."""
        if self._target is None or version < self._target[0]:
            self._previous = None  # a restore: no older version is this lineage's
        elif version > self._target[0]:
            self._previous = self._target[0]
        self._target = (version, weights)
        if not push:
            return
        if self._workers.closed:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return  # before the loop runs: the first probes sync every server
        for server in self._workers:
            if server.health is not WorkerHealth.DEAD:
                self._start_sync(server)

    def _is_current(self, server: _Server) -> bool:
        if not self._sync.tracks_versions or self._target is None:
            return True
        return server.version == self._target[0]

    def _start_sync(self, server: _Server) -> None:
        if not server.syncing and not self._is_current(server):
            server.syncing = True
            self._workers.spawn(self._sync_server(server), f"sync-{server.url}")

    async def _drained(self, server: _Server) -> None:
        """Wait until no call is in flight on ``server`` (each has a total deadline)."""
        await self._workers.wait_until(lambda: server.in_flight == 0)

    async def _sync_server(self, server: _Server) -> None:
        try:
            while self._target is not None and not self._is_current(server):
                version, weights = self._target
                timeout = self._sync_timeout_s
                prepared = monotonic()
                if isinstance(self._sync, PreparingWeightSync):
                    # While the server still serves the calls its version may (see the
                    # module docstring); the file is written once for every server.
                    try:
                        async with asyncio.timeout(timeout):
                            await self._sync.prepare(version, weights)
                    except (TimeoutError, OSError) as error:
                        # Nothing was sent: the server holds what it held.
                        self._failed(server, f"weights for version {version}: {error!r}")
                        return
                    if self._workers.closed:
                        return
                    if self._target[0] != version:
                        continue  # newer weights meanwhile: prepare those
                drained_from = monotonic()
                write_s = drained_from - prepared
                server.draining = True
                if self._sync.exclusive and not self._interrupt:
                    # No new call reaches it; the push waits for the calls in flight, so
                    # none of them sees two versions.
                    await self._drained(server)
                    if self._workers.closed or self._target is None or self._is_current(server):
                        break
                    if self._target[0] != version:
                        server.draining = False
                        continue
                started = monotonic()
                server.pushes_started += 1
                try:
                    async with asyncio.timeout(timeout):  # the whole push, not each read
                        reported = await self._push(server, version, weights, timeout)
                except TimeoutError:
                    server.version = None  # a push cut half way: its weights are unknown
                    self._push_failed(
                        server, version, started, f"weight push not done within {timeout} s"
                    )
                    return
                except (httpx.HTTPError, OSError) as error:
                    # OSError: the push's own local work failed (a weights file not
                    # written); the next probe retries like after a refused push. What
                    # the server held before is not what it holds now, for all we know.
                    server.version = None
                    self._push_failed(server, version, started, f"weight push failed: {error!r}")
                    return
                finally:
                    server.draining = False
                server.stats.weight_pushes += 1
                server.pushes_failed_in_a_row = 0
                server.version = reported
                # The push's cost on the step's path as before issue 28: the local work
                # and the exchange, not the wait for the server's own calls to end.
                push_s = monotonic() - started
                detail: dict[str, object] = {
                    "version": reported,
                    "seconds": round(write_s + push_s, 4),
                    "write_s": round(write_s, 4),
                    # Not in ``seconds``: the wait for the server's own calls to end.
                    "drain_s": round(started - drained_from, 4),
                }
                # Where the exchange went, request by request (a user's first question
                # when a push is slow).
                detail.update(self._phases_of(server))
                self._on_event("weights_loaded", server.url, detail)
                if reported != version:
                    # It refused or lost our push: out of rotation until a later probe
                    # syncs it.
                    self._failed(server, f"reports version {reported} after pushing {version}")
                    return
            if (
                server.health is not WorkerHealth.HEALTHY
                and server.failures_in_a_row == 0
                and not self._quarantined(server)
            ):
                self._move(server, WorkerHealth.HEALTHY, version=server.version)
            self._workers.wake()  # it holds the current version now: eligible if exclusive
        finally:
            server.syncing = False
            server.draining = False

    def _phases_of(self, server: _Server) -> dict[str, float]:
        """The seconds of each phase the newest push to ``server`` reached (none when the
        sync does not time them)."""
        if not isinstance(self._sync, TimedWeightSync):
            return {}
        return {name: round(s, 4) for name, s in self._sync.push_phases(server.url).items()}

    def _push_failed(self, server: _Server, version: int, started: float, why: str) -> None:
        # Reported at the failure, phases and all: the next probe's retry starts a new
        # push whose phases replace these, so read later they would be the retry's. Only
        # the first failure of a streak: a server that answers its probes but fails every
        # push is retried each probe interval, and would journal an event each time.
        server.pushes_failed_in_a_row += 1
        if server.pushes_failed_in_a_row == 1:
            self._on_event(
                "weights_push_failed",
                server.url,
                {
                    "version": version,
                    "why": _capped(why),
                    "seconds": round(monotonic() - started, 4),
                    **self._phases_of(server),
                },
            )
        self._failed(server, why)

    async def _push(
        self, server: _Server, version: int, weights: Weights, timeout: float
    ) -> int | None:
        if self._interrupt:
            # Calls in flight are paused between tokens, not waited for: they go on under
            # the new weights, and their spans say which tokens each version generated.
            assert isinstance(self._sync, InterruptingWeightSync)
            return await self._sync.push_keeping_calls(
                self._client, server.url, version, weights, timeout
            )
        return await self._sync.push(self._client, server.url, version, weights, timeout)

    # -- probes ----------------------------------------------------------------------------

    async def _probe_loop(self, server: _Server) -> None:
        while not self._workers.closed:
            await self._probe(server)
            await asyncio.sleep(self._http.probe_interval_s)

    def _quarantined(self, server: _Server) -> bool:
        return server.health is WorkerHealth.DEAD and monotonic() < server.quarantined_until

    async def _probe(self, server: _Server) -> None:
        if self._quarantined(server):
            return  # its probes cannot vouch for its replies
        timeout = self._http.probe_timeout_s
        confirmed, pushes = server.version, server.pushes_started
        reported: object = _NOT_ASKED
        try:
            # One deadline for the whole exchange: a server that drips its reply a byte
            # per read passes every per-read timeout.
            async with asyncio.timeout(timeout):
                async with self._client.stream(
                    "GET", f"{server.url}/health", timeout=timeout
                ) as response:
                    response.raise_for_status()
                    await read_body(response, _PROBE_BODY_CAP)
                if self._asks_weight_info(server):
                    reported = await self._weight_info(server, timeout)
        except (httpx.HTTPError, DataFailure, TimeoutError) as error:
            if server.health is not WorkerHealth.DEAD:
                self._failed(server, f"probe failed: {type(error).__name__}")
            return
        if self._quarantined(server):
            return  # quarantined while the probe was out: its answer vouches for nothing
        server.failures_in_a_row = 0
        if (
            reported is not _NOT_ASKED
            and confirmed is not None
            and confirmed == server.version
            and pushes == server.pushes_started
            and not server.syncing
            and parse_version(reported) != confirmed
        ):
            # No push began or ended meanwhile: it serves other weights than it confirmed.
            self._untrusted(server, "/weight_info", confirmed, reported)
            return
        if server.health is WorkerHealth.DEAD:
            # It answers again: refit it before it takes traffic.
            server.version = None
            self._move(server, WorkerHealth.RECOVERING)
        if not self._is_current(server):
            self._start_sync(server)  # the sync admits it once it holds the current version
        elif server.health is not WorkerHealth.HEALTHY:
            self._move(server, WorkerHealth.HEALTHY, version=server.version)

    def _asks_weight_info(self, server: _Server) -> bool:
        # A dead server that answers again is refit whatever it holds (it may have
        # restarted): only a live one's word is held against what it confirmed.
        return (
            self._sync.tracks_versions
            and server.weight_info
            and server.version is not None
            and not server.syncing
            and server.health is not WorkerHealth.DEAD
        )

    async def _weight_info(self, server: _Server, timeout: float) -> object:
        """What ``/weight_info`` names (``weight_version``, else ``version``); a server
        without the route (404) is not asked again."""
        async with self._client.stream(
            "GET", f"{server.url}/weight_info", timeout=timeout
        ) as response:
            if response.status_code == 404:
                server.weight_info = False
                return _NOT_ASKED
            response.raise_for_status()
            raw = await read_body(response, _PROBE_BODY_CAP)
        try:
            reply = msgspec.json.decode(raw, type=_WeightInfo)
        except (msgspec.DecodeError, RecursionError):
            return raw[:40]  # names no version: not what it confirmed
        return reply.weight_version if reply.weight_version is not None else reply.version

    def _untrusted(self, server: _Server, via: str, confirmed: int, named: object) -> None:
        """``server`` said it serves weights other than it confirmed loading."""
        self._on_event(
            "server_weights_mismatch",
            server.url,
            {"via": via, "confirmed": confirmed, "named": repr(named)[:_NAMED_CHARS]},
        )
        self._bad_reply(server, DataError.WEIGHT_VERSION_MISMATCH)

    def blame(self, url: str, *, step: int, rows: int) -> None:
        """The trainer refused ``rows`` of ``url``'s rows at ``step``: their logprobs are
        another model's under the very weights it confirmed. Like a server caught lying
        about its weights: what it confirmed is forgotten, and it is dead and quarantined
        at once (an unknown url, a server gone from the pool, is ignored)."""
        server = next((s for s in self._workers if s.url == url), None)
        if server is None:
            return
        self._on_event("server_logprob_mismatch", url, {"step": step, "rows": rows})
        self._bad_reply(server, _LOGPROB_MISMATCH)

    def _failed(self, server: _Server, why: str) -> None:
        why = _capped(why)
        server.failures_in_a_row += 1
        if server.failures_in_a_row >= self._http.dead_after_failures:
            self._move(server, WorkerHealth.DEAD, why=why)
        elif server.health is WorkerHealth.HEALTHY:
            self._move(server, WorkerHealth.SUSPECT, why=why)

    # -- calls -----------------------------------------------------------------------------

    def _admits(self, server: _Server, floor: int | None) -> bool:
        # With interrupt a lagging server keeps taking calls: its push will pause them
        # between tokens and they finish under the new weights.
        exclusive = self._sync.exclusive and not self._interrupt
        if not exclusive or self._is_current(server):
            return True
        # A lagging server whose push is still preparing serves, at the version it holds,
        # the calls that version may serve (the module docstring).
        return (
            floor is not None
            and server.syncing
            and not server.draining
            and server.version is not None
            and server.version == self._previous
            and floor <= server.version
        )

    async def acquire(
        self, avoid: set[str], prefer: str | None = None, *, floor: int | None = None
    ) -> Lease:
        """A healthy server with a free slot (avoiding ``avoid`` when another is free),
        ``prefer`` when it is one of them: an attempt's calls stay on one server where
        they can, so its row is one server's (a liar's rows are its own, see ``blame``).
        ``floor``: the oldest weight version the call may be generated by (its attempt's
        dispatch version); None takes only servers at the newest version.

        Waits for one up to ``no_server_wait_s``, then raises
        ``GenerationError("no_live_server")``: a fleet that stays down fails attempts, it
        never makes them wait forever.
        """
        self.start()

        def choose(free: Sequence[_Server]) -> _Server:
            allowed = [s for s in free if s.url not in avoid] or free
            preferred = [s for s in allowed if s.url == prefer]
            return preferred[0] if preferred else least_loaded(allowed)

        def timed_out() -> GenerationError:
            return GenerationError(
                FailureReason.NO_LIVE_SERVER,
                f"no healthy server with a free slot for {self._http.no_server_wait_s}"
                f" s; states: {self.states()}",
            )

        server = await self._workers.acquire(
            wait_s=self._http.no_server_wait_s,
            timed_out=timed_out,
            eligible=lambda server: self._admits(server, floor),
            choose=choose,
        )
        server.stats.calls += 1
        stamp = server.version if self._sync.tracks_versions else None
        return Lease(server.url, stamp)

    async def release(self, lease: Lease, *, outcome: str, reason: str = "") -> None:
        """End a call: ``ok``; ``data`` (the request was refused: no verdict on the
        server); ``bad_data`` (the server's reply was unusable, ``reason`` says how);
        ``infra``; or ``cancelled`` (the caller gave up: no verdict on the server)."""
        server = self._workers[lease.url]
        self._workers.release(server)
        if outcome == "cancelled":
            pass
        elif outcome == "ok":
            server.failures_in_a_row = 0
            server.bad_replies_in_a_row = 0
        elif outcome == "data":
            server.stats.data_failures += 1
            server.failures_in_a_row = 0
        elif outcome == "bad_data":
            server.stats.data_failures += 1
            self._bad_reply(server, reason)
        else:
            server.stats.infra_failures += 1
            self._failed(server, "call failed")

    def _bad_reply(self, server: _Server, reason: str) -> None:
        server.bad_replies_in_a_row += 1
        in_a_row = server.bad_replies_in_a_row
        untrusted = reason in _UNTRUSTED_REASONS
        if untrusted:
            # Its word on its weights is proven wrong: what it confirmed is not believed
            # (a push must confirm again), and no streak is waited for.
            server.version = None
        if untrusted or in_a_row >= self._http.dead_after_failures:
            quarantine = self._http.bad_data_quarantine_s
            server.quarantined_until = monotonic() + quarantine
            if server.health is not WorkerHealth.DEAD:
                self._on_event(
                    "server_bad_data",
                    server.url,
                    {"reason": reason, "in_a_row": in_a_row, "quarantine_s": quarantine},
                )
                why = reason if untrusted else f"{in_a_row} bad replies: {reason}"
                self._move(server, WorkerHealth.DEAD, why=why)
        elif server.health is WorkerHealth.HEALTHY:
            self._move(server, WorkerHealth.SUSPECT, why=f"bad reply: {reason}")


def _capped(why: str) -> str:
    """``why`` cut to :data:`_WHY_CHARS`, saying how much was left out."""
    if len(why) <= _WHY_CHARS:
        return why
    return f"{why[:_WHY_CHARS]}... ({len(why) - _WHY_CHARS} more characters)"
