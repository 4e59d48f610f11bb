"""One lifecycle for every resource (issue 16): every class in src deriving from
``AsyncResource`` or ``Resource`` has exactly one shutdown verb, and closing it twice is a
no-op. A new resource class fails here until it gets a factory below (or a reason not to).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import pkgutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import rollout_recovery
from rollout_recovery._lifecycle import AsyncResource, Resource

Factory = Callable[[Path], AsyncResource]


def _journal(tmp: Path) -> AsyncResource:
    from rollout_recovery.history._journal import JournalWriter

    return JournalWriter(tmp / "events.jsonl")


def _trail(tmp: Path) -> AsyncResource:
    from rollout_recovery.history import AuditTrail
    from rollout_recovery.rundir import RunDirectory

    return AuditTrail(RunDirectory(tmp))


def _memory(tmp: Path) -> AsyncResource:
    from rollout_recovery.dataplane import MemoryDataPlane

    return MemoryDataPlane()


def _sqlite(tmp: Path) -> AsyncResource:
    from rollout_recovery.dataplane import SqliteDataPlane

    return SqliteDataPlane(tmp / "rows.sqlite")


def _deferred(tmp: Path) -> AsyncResource:
    from rollout_recovery.control._deferred import DeferredDeletionDataPlane
    from rollout_recovery.dataplane import SqliteDataPlane

    return DeferredDeletionDataPlane(SqliteDataPlane(tmp / "rows.sqlite"), keep=1)


def _recorder(tmp: Path) -> AsyncResource:
    from rollout_recovery.recorder import Recorder

    return Recorder.open(tmp / "run", group_size=2)


def _pause_gate(tmp: Path) -> AsyncResource:
    from rollout_recovery.serve._pause import PauseGate

    return PauseGate()


def _serve_app(tmp: Path) -> AsyncResource:
    from rollout_recovery.policy import NumpyGRPOTrainer
    from rollout_recovery.serve._app import ServeApp
    from rollout_recovery.serve._settings import ServeSettings
    from rollout_recovery.serve._weights import WeightStore

    weights = WeightStore(NumpyGRPOTrainer(seed=0).weights())
    return ServeApp(ServeSettings(), weights, stopping=threading.Event())


def _policy_server(tmp: Path) -> AsyncResource:
    from rollout_recovery.serve import PolicyServer

    # ``with`` starts it; ``async with`` leaves it unstarted (both close it).
    return PolicyServer()


def _local_fleet(tmp: Path) -> AsyncResource:
    from rollout_recovery.job._server_fleet import LocalServerFleet

    # Never started: closing one stops nothing (tests/job/test_http_job.py closes a
    # started one twice).
    return LocalServerFleet(tmp, 1, seed=0, call_latency_s=0.0, model="m")


def _vllm_fleet(tmp: Path) -> AsyncResource:
    from rollout_recovery.vllm import VllmConfig
    from rollout_recovery.vllm._fleet import VllmFleet

    # Never started (tests/vllm/test_vllm_fleet.py closes a started one twice).
    return VllmFleet(tmp / "s", tmp / "s.json", VllmConfig(), served_model_name="m")


def _vllm_weight_sync(tmp: Path) -> AsyncResource:
    from rollout_recovery.vllm._sync import VllmWeightSync

    # Closed twice with files in it: tests/vllm/test_vllm_weight_sync.py.
    return VllmWeightSync(tmp / "weights")


def _server_transport(tmp: Path) -> AsyncResource:
    from rollout_recovery._unix_http import ServerTransport

    return ServerTransport()


def _fanout(tmp: Path) -> AsyncResource:
    from rollout_recovery.metrics._fanout import MetricsFanout

    return MetricsFanout([], resume_step=0)


def _background(tmp: Path) -> AsyncResource:
    from rollout_recovery.metrics._background import BackgroundSink
    from rollout_recovery.metrics._fanout import MetricsFanout

    inner = MetricsFanout([], resume_step=0)
    return BackgroundSink(inner, name="test", queue_size=4, timeout_s=60.0)


def _reporter(tmp: Path) -> AsyncResource:
    import io

    from rollout_recovery.job._report import RunReporter

    return RunReporter(io.StringIO())


def _console_samples(tmp: Path) -> AsyncResource:
    import io

    from rollout_recovery.job._report import ConsoleSamples, RunReporter

    return ConsoleSamples(RunReporter(io.StringIO()))


def _worker_pool(tmp: Path) -> AsyncResource:
    from rollout_recovery._workers import Worker, WorkerPool

    pool: WorkerPool[Worker] = WorkerPool(closed_error=lambda: RuntimeError("closed"))
    pool.add(Worker(name="w0", capacity=1))
    return pool


def _simulated_backend(tmp: Path) -> AsyncResource:
    from rollout_recovery.dataplane import MemoryDataPlane
    from rollout_recovery.policy import NumpyGRPOTrainer, TaskConfig, TaskSet
    from rollout_recovery.rollout import (
        DigitTask,
        FaultsConfig,
        GenerationConfig,
        SimulatedAgentBackend,
    )

    return SimulatedAgentBackend(
        GenerationConfig(workers=2),
        faults=FaultsConfig(),
        episodes=DigitTask(TaskSet(16, seed=0, prompt_group_every=4), TaskConfig()),
        seed=0,
        initial_weights=NumpyGRPOTrainer(seed=0).weights(),
        data_plane=MemoryDataPlane(),  # the default faults include tampering with it
    )


def _http_backend(tmp: Path) -> AsyncResource:
    from rollout_recovery.policy import NumpyGRPOTrainer, TaskConfig, TaskSet
    from rollout_recovery.rollout import (
        DigitTask,
        GenerationConfig,
        HttpConfig,
        HttpGenerationBackend,
    )

    trainer = NumpyGRPOTrainer(seed=0)
    # Never started: no server is contacted; closing it closes the client it made.
    return HttpGenerationBackend(
        HttpConfig(servers=("http://127.0.0.1:9",)),
        generation=GenerationConfig(),
        episodes=DigitTask(TaskSet(16, seed=0, prompt_group_every=4), TaskConfig()),
        vocab_size=trainer.weights().vocab_size,
        initial_version=0,
        initial_weights=trainer.weights(),
    )


def _server_pool(tmp: Path) -> AsyncResource:
    import httpx

    from rollout_recovery.rollout import HttpConfig
    from rollout_recovery.rollout._server_pool import ServerPool
    from rollout_recovery.rollout._weight_sync import WEIGHT_SYNCS

    return ServerPool(
        HttpConfig(servers=("http://127.0.0.1:9",)),
        weight_sync=WEIGHT_SYNCS["none"],
        client=httpx.AsyncClient(),
    )


def _transformers_backend(tmp: Path) -> AsyncResource:
    pytest.importorskip("transformers")  # the [llm] extra
    from rollout_recovery.llm._backend import TransformersBackend

    # Closing needs no model: a backend that ran nothing holds nothing but its flag.
    backend = TransformersBackend.__new__(TransformersBackend)
    backend._closed = False
    return backend


def _recorder_service(tmp: Path) -> AsyncResource:
    # The body of verl's recorder actor (and of its in-process link): no verl or Ray needed.
    from rollout_recovery.adapters._recorder_link import RecorderService

    return RecorderService(str(tmp / "run"), 2)


FACTORIES: dict[str, Factory] = {
    "SimulatedAgentBackend": _simulated_backend,
    "HttpGenerationBackend": _http_backend,
    "ServerPool": _server_pool,
    "TransformersBackend": _transformers_backend,
    "WorkerPool": _worker_pool,
    "JournalWriter": _journal,
    "AuditTrail": _trail,
    "MemoryDataPlane": _memory,
    "SqliteDataPlane": _sqlite,
    "DeferredDeletionDataPlane": _deferred,
    "Recorder": _recorder,
    "RecorderService": _recorder_service,
    "PauseGate": _pause_gate,
    "ServeApp": _serve_app,
    "PolicyServer": _policy_server,
    "LocalServerFleet": _local_fleet,
    "VllmFleet": _vllm_fleet,
    "VllmWeightSync": _vllm_weight_sync,
    "ServerTransport": _server_transport,
    "MetricsFanout": _fanout,
    "BackgroundSink": _background,
    "RunReporter": _reporter,
    "ConsoleSamples": _console_samples,
}

#: Factories of classes defined in a module that imports an extra: without the extra the
#: module does not import, so the class is not found (nor is it stale).
NEEDS_EXTRA = {"TransformersBackend": "transformers"}

#: Resource classes built elsewhere, with where closing twice is tested.
ELSEWHERE = {
    # Their tools are extras (tensorboard, wandb, mlflow); close() drops the tool's handle
    # before finishing it, and MetricsFanout closes each once.
    "TensorBoardSink": "tests/metrics (with the [tensorboard] extra)",
    "WandbSink": "tests/metrics (with the [wandb] extra)",
    "MlflowSink": "tests/metrics (with the [mlflow] extra)",
    # Needs a Ray cluster: the store contract closes it twice (tests/cluster, marker ray).
    "RayShardedDataPlane": "tests/dataplane/store_contract.py via tests/cluster",
    # Needs actors; its close kills each once (marked dead), and tests/cluster closes it.
    "RayGenerationBackend": "tests/cluster/test_ray_backend.py",
}


def _import_everything() -> None:
    for module in pkgutil.walk_packages(rollout_recovery.__path__, "rollout_recovery."):
        if module.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(module.name)
        except ImportError as error:
            if (error.name or "").startswith("rollout_recovery"):
                raise  # ours: a real error, not an extra that is not installed


def _subclasses(base: type) -> Iterator[type]:
    for sub in base.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def resource_classes() -> dict[str, type[AsyncResource]]:
    _import_everything()
    found: dict[str, type[AsyncResource]] = {}
    for cls in _subclasses(AsyncResource):
        if cls.__module__.startswith("rollout_recovery.") and cls is not Resource:
            found[cls.__name__] = cls
    return found


def test_every_resource_has_exactly_one_verb() -> None:
    wrong = []
    for name, cls in resource_classes().items():
        for verb in ("stop", "shutdown"):
            if hasattr(cls, verb):
                wrong.append(f"{name} has {verb}()")
        if issubclass(cls, Resource):
            if cls.close is Resource.close:
                wrong.append(f"{name} is a Resource and does not define close()")
            if cls.aclose is not Resource.aclose:
                wrong.append(f"{name} is a Resource and overrides aclose()")
        else:
            if cls.aclose is AsyncResource.aclose:
                wrong.append(f"{name} is an AsyncResource and does not define aclose()")
            if hasattr(cls, "close"):
                wrong.append(f"{name} is an AsyncResource and has close()")
    assert not wrong, wrong


def test_every_resource_is_closed_twice_below_or_elsewhere() -> None:
    names = set(resource_classes())
    untested = names - set(FACTORIES) - set(ELSEWHERE)
    assert not untested, f"give these a factory in FACTORIES: {sorted(untested)}"
    # A factory of a class that is no resource any more is stale; one whose extra is not
    # installed is not (its module cannot be imported, so its class cannot be found).
    absent = {
        name for name, extra in NEEDS_EXTRA.items() if importlib.util.find_spec(extra) is None
    }
    assert set(FACTORIES) - absent <= names, sorted(set(FACTORIES) - absent - names)


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_closing_twice_is_a_no_op(name: str, tmp_path: Path) -> None:
    resource = FACTORIES[name](tmp_path)
    if isinstance(resource, Resource):
        with resource as entered:
            assert entered is resource
        resource.close()
    else:
        asyncio.run(resource.aclose())
    asyncio.run(resource.aclose())


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_async_with_closes_and_a_later_close_is_a_no_op(name: str, tmp_path: Path) -> None:
    resource = FACTORIES[name](tmp_path)

    async def use() -> None:
        async with resource as entered:
            assert entered is resource
        await resource.aclose()

    asyncio.run(use())
