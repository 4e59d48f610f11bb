"""A simulated agent environment behind :class:`GenerationBackend`, with fault injection.

One attempt is an agent episode of two model calls on one simulated worker:

1. *reasoning*: prompt = the task prompt, generates ``reasoning_tokens`` thought tokens;
2. *answer*: prompt = call 1's prompt + its tokens + ``[ANSWER]`` (so it extends its parent
   exactly), generates ``[answer digit, EOS]``.

Each call waits a lognormal latency, samples from the newest policy snapshot, and is staged
through the attempt's :class:`CaptureWriter` before the episode goes on: the call record is
the acknowledgement. Every random choice of an attempt comes from a generator seeded by
``(seed, rollout_id)``, so an attempt's faults, latencies and tokens do not depend on how
attempts interleave (only worker placement and which snapshot is current do).

Faults (rates per attempt; when several are drawn the first in this list wins among the
ones that exclude each other):

- ``worker_crash``: after call 1, the attempt crashes its worker. Every attempt in flight
  on that worker, itself included, raises ``GenerationError("worker_crashed")`` at once;
  the worker is down for ``worker_restart_s`` and new attempts go to other workers (or
  wait for one to come back).
- ``attempt_failed``: raises ``GenerationError("attempt_failed")`` after call 1, leaving a
  staged row no receipt references (the restore inventory pass owns such rows).
- ``hang``: after call 1 the attempt waits forever (only its worker's crash or the
  controller's cancellation ends it).
- ``capture_failure``: call 2 is not staged; the receipt carries a ``CaptureFailure`` and is
  poisoned, so finalization makes the row a masked placeholder.
- ``tamper``: call 2's staged row is overwritten with altered tokens and identical metadata,
  so ``verify_and_linearize`` rejects it at finalization.
- ``straggler``: independent of the others; both calls' latencies are multiplied.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from ..capture import CallRecord, CaptureFailure, CaptureWriter, staging_key
from ..dataplane import DataPlane, Row
from ..errors import GenerationError, InvalidArgumentError, InvalidArgumentTypeError
from ..policy import (
    DIGIT_BASE,
    PolicySnapshot,
    TaskSet,
)
from ._digit_task import answer_prompt, finished_attempt, task_prompt
from ._protocol import AttemptRequest, AttemptResult

__all__ = ["CAPTURE_FAILURE_REASON", "FaultSettings", "SimulatedAgentBackend"]

# The CaptureFailure reason of a skipped staging write; it poisons the receipt.
CAPTURE_FAILURE_REASON = "staging_write_failed"

# Fault counters, in the order their uniform draws are taken from an attempt's generator.
_FAULT_NAMES = (
    "straggler",
    "worker_crash",
    "attempt_failed",
    "hang",
    "capture_failure",
    "tamper",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultSettings:
    """Per-attempt fault probabilities; all zero means a fault-free environment.

    ``straggler_factor`` multiplies a straggler's call latencies (>= 1);
    ``worker_restart_s`` is how long a crashed worker stays down.
    """

    attempt_failure_rate: float = 0.0
    straggler_rate: float = 0.0
    straggler_factor: float = 1.0
    hang_rate: float = 0.0
    capture_failure_rate: float = 0.0
    tamper_rate: float = 0.0
    worker_crash_rate: float = 0.0
    worker_restart_s: float = 0.0

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidArgumentError(f"{field.name} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise InvalidArgumentError(f"{field.name} must be finite, got {value!r}")
            if field.name.endswith("_rate") and not 0.0 <= value <= 1.0:
                raise InvalidArgumentError(f"{field.name} must be in [0, 1], got {value!r}")
        if self.straggler_factor < 1.0:
            raise InvalidArgumentError(
                f"straggler_factor must be >= 1, got {self.straggler_factor!r}"
            )
        if self.worker_restart_s < 0.0:
            raise InvalidArgumentError(
                f"worker_restart_s must be >= 0, got {self.worker_restart_s!r}"
            )


class _Life:
    """One life of a worker: its crash ends every attempt admitted during it."""

    __slots__ = ("crashed",)

    def __init__(self) -> None:
        self.crashed = asyncio.Event()


class _Worker:
    __slots__ = ("in_flight", "index", "life", "name", "up")

    def __init__(self, index: int) -> None:
        self.index = index
        self.name = f"worker-{index}"
        self.up = True
        self.in_flight = 0
        self.life = _Life()


@dataclass(frozen=True, slots=True)
class _Draws:
    """What one attempt's generator decided before the episode starts."""

    faults: frozenset[str]
    latencies: tuple[float, float]


def _attempt_seed(seed: int, rollout_id: str) -> list[int]:
    digest = hashlib.sha256(rollout_id.encode("utf-8")).digest()
    return [seed, int.from_bytes(digest[:16], "little")]


def _call_id(rollout_id: str, index: int, kind: str) -> str:
    # Deterministic and unique per physical call: a retry is a new rollout_id, so its calls
    # get new ids too. The hash keeps ids short whatever the rollout id's length.
    digest = hashlib.sha256(f"{rollout_id}/{index}".encode()).hexdigest()[:16]
    return f"{kind}-{digest}"


class SimulatedAgentBackend:
    """Implements :class:`~rollout_recovery.rollout.GenerationBackend` in process.

    ``data_plane`` must be the store the attempts' ``CaptureWriter`` writes to; it is only
    needed (and then required) for the tamper fault, which rewrites a staged row behind the
    writer's back. ``stage_in_thread`` runs each ``stage_call`` in a worker thread, for a
    durable store whose fsync should not block the event loop. A backend's events belong
    to the first event loop that waits on them: use one backend per loop.
    """

    def __init__(
        self,
        *,
        task_set: TaskSet,
        seed: int,
        workers: int,
        call_latency_s: float,
        latency_jitter: float,
        faults: FaultSettings,
        initial_weights: PolicySnapshot,
        data_plane: DataPlane | None = None,
        reasoning_tokens: int = 4,
        stage_in_thread: bool = False,
    ) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise InvalidArgumentError(f"workers must be a positive int, got {workers!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise InvalidArgumentError(f"seed must be a non-negative int, got {seed!r}")
        if not (math.isfinite(call_latency_s) and call_latency_s >= 0):
            raise InvalidArgumentError(f"call_latency_s must be >= 0, got {call_latency_s!r}")
        if not (math.isfinite(latency_jitter) and latency_jitter >= 0):
            raise InvalidArgumentError(f"latency_jitter must be >= 0, got {latency_jitter!r}")
        if (
            isinstance(reasoning_tokens, bool)
            or not isinstance(reasoning_tokens, int)
            or reasoning_tokens < 1
        ):
            raise InvalidArgumentError(
                f"reasoning_tokens must be a positive int, got {reasoning_tokens!r}"
            )
        self._task_set = task_set
        self._seed = seed
        self._latency = float(call_latency_s)
        self._jitter = float(latency_jitter)
        self._data_plane = data_plane
        self._reasoning_tokens = reasoning_tokens
        self._stage_in_thread = stage_in_thread
        self._faults = self._checked_faults(faults)
        self._snapshot = self._checked_snapshot(initial_weights.version, initial_weights)
        self._workers = [_Worker(i) for i in range(workers)]
        self._next_worker = 0
        self._worker_changed: asyncio.Condition | None = None
        self._restarts: set[asyncio.Task[None]] = set()
        self._crashes = 0
        self._fault_counts = dict.fromkeys(_FAULT_NAMES, 0)
        self._closed = False

    # -- configuration and introspection -------------------------------------------------

    def _checked_faults(self, faults: FaultSettings) -> FaultSettings:
        if not isinstance(faults, FaultSettings):
            raise InvalidArgumentTypeError(
                f"faults must be FaultSettings, got {type(faults).__name__}"
            )
        if faults.tamper_rate > 0 and self._data_plane is None:
            raise InvalidArgumentError("the tamper fault needs data_plane= (the writer's store)")
        return faults

    @staticmethod
    def _checked_snapshot(version: int, weights: object) -> PolicySnapshot:
        if not isinstance(weights, PolicySnapshot):
            raise InvalidArgumentTypeError(
                f"weights must be a PolicySnapshot, got {type(weights).__name__}"
            )
        if weights.version != version:
            raise InvalidArgumentError(
                f"weights are version {weights.version}, announced as {version}"
            )
        return weights

    @property
    def faults(self) -> FaultSettings:
        return self._faults

    def set_faults(self, faults: FaultSettings) -> None:
        """Change fault rates for attempts that start from now on (e.g. a fault schedule)."""
        self._faults = self._checked_faults(faults)

    @property
    def weight_version(self) -> int:
        """The version of the snapshot new calls sample from."""
        return self._snapshot.version

    @property
    def worker_crashes(self) -> int:
        """How many worker crashes were injected so far."""
        return self._crashes

    @property
    def fault_counts(self) -> dict[str, int]:
        """Injected faults by name (``straggler``, ``worker_crash``, ``attempt_failed``,
        ``hang``, ``capture_failure``, ``tamper``); a copy."""
        return dict(self._fault_counts)

    def worker_status(self) -> dict[str, bool]:
        """Whether each worker is up, by name."""
        return {worker.name: worker.up for worker in self._workers}

    def worker_load(self) -> dict[str, int]:
        """Attempts in flight on each worker, by name (crashed ones count until they exit)."""
        return {worker.name: worker.in_flight for worker in self._workers}

    def update_weights(self, version: int, weights: object) -> None:
        """Weight sync: every call that starts after this samples from ``weights``.

        Calls already sampled keep their version; the second call of an attempt in flight
        may use a newer snapshot than its first, as with in-flight updates of a real
        engine. Each call's staged ``weight_version`` is the snapshot it sampled from.
        """
        self._snapshot = self._checked_snapshot(version, weights)

    # -- workers --------------------------------------------------------------------------

    def _condition(self) -> asyncio.Condition:
        # Created lazily inside the running loop: the backend may be built outside one.
        if self._worker_changed is None:
            self._worker_changed = asyncio.Condition()
        return self._worker_changed

    def _closed_error(self) -> GenerationError:
        return GenerationError("backend_closed", "the simulated backend is closed")

    async def _acquire_worker(self) -> _Worker:
        """The least loaded worker that is up (round robin among equals); waits if none."""
        condition = self._condition()
        async with condition:
            await condition.wait_for(
                lambda: self._closed or any(worker.up for worker in self._workers)
            )
            if self._closed:
                raise self._closed_error()
            count = len(self._workers)
            worker = min(
                (w for w in self._workers if w.up),
                key=lambda w: (w.in_flight, (w.index - self._next_worker) % count),
            )
            self._next_worker = (worker.index + 1) % count
            worker.in_flight += 1
            return worker

    def _crash(self, worker: _Worker) -> None:
        """End the worker's current life; a restart task brings up a new one."""
        self._crashes += 1
        self._fault_counts["worker_crash"] += 1
        worker.up = False
        worker.life.crashed.set()
        task = asyncio.get_running_loop().create_task(
            self._restart(worker), name=f"restart-{worker.name}"
        )
        self._restarts.add(task)
        task.add_done_callback(self._restarts.discard)

    async def _restart(self, worker: _Worker) -> None:
        await asyncio.sleep(self._faults.worker_restart_s)
        worker.life = _Life()
        worker.up = True
        condition = self._condition()
        async with condition:
            condition.notify_all()

    @staticmethod
    def _crashed_error(worker: _Worker) -> GenerationError:
        return GenerationError(
            "worker_crashed", f"{worker.name} crashed mid-episode", worker=worker.name
        )

    async def _wait_on(self, worker: _Worker, life: _Life, seconds: float | None) -> None:
        """Sleep ``seconds`` (forever for None) unless the worker's life ends first.

        Only this wait's own timeout becomes a normal return; an outer cancellation (the
        controller's deadline) propagates as ``CancelledError``, which asyncio.timeout
        tells apart from its own expiry through the task's cancel count.
        """
        if life.crashed.is_set():
            raise self._crashed_error(worker)
        try:
            async with asyncio.timeout(seconds):
                await life.crashed.wait()
        except TimeoutError:
            return
        raise self._crashed_error(worker)

    # -- one attempt ----------------------------------------------------------------------

    def _draw(self, rng: np.random.Generator, faults: FaultSettings) -> _Draws:
        # A fixed number of draws in a fixed order: changing one rate never reshuffles the
        # other faults, the latencies or the sampled tokens of an attempt.
        uniforms = rng.random(len(_FAULT_NAMES))
        rates = {
            "straggler": faults.straggler_rate,
            "worker_crash": faults.worker_crash_rate,
            "attempt_failed": faults.attempt_failure_rate,
            "hang": faults.hang_rate,
            "capture_failure": faults.capture_failure_rate,
            "tamper": faults.tamper_rate,
        }
        drawn = frozenset(
            name for name, u in zip(_FAULT_NAMES, uniforms, strict=True) if u < rates[name]
        )
        normals = rng.standard_normal(2)
        factor = faults.straggler_factor if "straggler" in drawn else 1.0
        first, second = (
            self._latency * math.exp(self._jitter * float(z)) * factor for z in normals
        )
        return _Draws(faults=drawn, latencies=(first, second))

    async def _stage(self, capture: CaptureWriter, **call: Any) -> CallRecord:
        if self._stage_in_thread:
            return await asyncio.to_thread(lambda: capture.stage_call(**call))
        return capture.stage_call(**call)

    def _tamper(self, capture: CaptureWriter, key: str) -> None:
        assert self._data_plane is not None  # _checked_faults guarantees it
        (row,) = self._data_plane.get(capture.partition, [key])
        token_ids = np.array(row.token_ids, dtype=np.int32)
        # Swap the answer digit for another one: plausible tokens, unchanged metadata, so
        # only the digest check can notice.
        generated = np.flatnonzero(row.token_mask == 1.0)
        position = int(generated[0])
        digit = int(token_ids[position]) - DIGIT_BASE
        token_ids[position] = DIGIT_BASE + (digit + 1) % 10
        altered = Row(
            token_ids=token_ids,
            token_mask=row.token_mask,
            logprobs=row.logprobs,
            metadata=row.metadata,
        )
        self._data_plane.put(capture.partition, {key: altered})

    async def run_attempt(self, request: AttemptRequest, capture: CaptureWriter) -> AttemptResult:
        """Run one two-call episode; see the module docstring for the faults."""
        if self._closed:
            raise self._closed_error()
        task = task_prompt(self._task_set, request.prompt)
        prompt_ids, digit = task.token_ids, task.digit
        rng = np.random.default_rng(_attempt_seed(self._seed, request.rollout_id))
        draws = self._draw(rng, self._faults)
        faults = draws.faults
        if "straggler" in faults:
            self._fault_counts["straggler"] += 1
        rollout_id = request.rollout_id
        reason_id = _call_id(rollout_id, 0, "reason")
        answer_id = _call_id(rollout_id, 1, "answer")

        worker = await self._acquire_worker()
        life = worker.life
        try:
            await self._wait_on(worker, life, draws.latencies[0])
            snapshot = self._snapshot
            thoughts, thought_logprobs = snapshot.sample_reasoning(
                digit, self._reasoning_tokens, rng
            )
            first = await self._stage(
                capture,
                rollout_id=rollout_id,
                model_call_id=reason_id,
                parent=None,
                prompt_token_ids=prompt_ids,
                generated_token_ids=thoughts,
                generated_logprobs=thought_logprobs,
                weight_version=snapshot.version,
            )
            if life.crashed.is_set():  # crashed by another attempt while staging
                raise self._crashed_error(worker)
            if "worker_crash" in faults:
                self._crash(worker)
                raise self._crashed_error(worker)
            if "attempt_failed" in faults:
                self._fault_counts["attempt_failed"] += 1
                raise GenerationError(
                    "attempt_failed",
                    "simulated agent error after the reasoning call",
                    worker=worker.name,
                )
            if "hang" in faults:
                self._fault_counts["hang"] += 1
                await self._wait_on(worker, life, None)
            await self._wait_on(worker, life, draws.latencies[1])
            snapshot = self._snapshot
            answer, answer_logprobs = snapshot.sample_answer(digit, rng)
            records = [first]
            failures: list[CaptureFailure] = []
            if "capture_failure" in faults:
                self._fault_counts["capture_failure"] += 1
                failures.append(
                    CaptureFailure(model_call_id=answer_id, reason=CAPTURE_FAILURE_REASON)
                )
            else:
                records.append(
                    await self._stage(
                        capture,
                        rollout_id=rollout_id,
                        model_call_id=answer_id,
                        parent=first,
                        prompt_token_ids=answer_prompt(task, thoughts),
                        generated_token_ids=answer,
                        generated_logprobs=answer_logprobs,
                        weight_version=snapshot.version,
                    )
                )
                if life.crashed.is_set():
                    raise self._crashed_error(worker)
                if "tamper" in faults:
                    self._fault_counts["tamper"] += 1
                    self._tamper(capture, staging_key(rollout_id, answer_id))
        finally:
            worker.in_flight -= 1

        return finished_attempt(
            task,
            rollout_id,
            records,
            thoughts=thoughts,
            answer=answer,
            answer_call_id=answer_id,
            failures=failures,
        )

    async def aclose(self) -> None:
        """Stop: cancel pending worker restarts and wake attempts waiting for a worker."""
        self._closed = True
        restarts = list(self._restarts)
        for task in restarts:
            task.cancel()
        await asyncio.gather(*restarts, return_exceptions=True)
        if self._worker_changed is not None:
            async with self._worker_changed:
                self._worker_changed.notify_all()
