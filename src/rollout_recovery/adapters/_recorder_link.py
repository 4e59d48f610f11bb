"""One recorder per run directory, reached from every agent-loop worker of a job.

The journal has one writer (``Recorder.open`` takes the run directory's lock), while verl
runs its agent loops in several worker processes (Ray actors), each building a new loop
instance per sample. So the recorder lives once per job and the loops reach it:

- ``"process"``: the recorder is opened in this process, once per run directory, and shared
  by every loop instance in it (the single-worker path, and verl's worker driven in process);
- ``"ray"``: the recorder lives in a named Ray actor (``RecorderService``), created by the
  first process that asks (``get_if_exists``) and found by name by every other one. Its
  calls run one at a time in the actor, so the journal keeps one writer. The actor shares
  the fate of the process that created it (Ray's ownership): created by verl's driver (the
  checkpoint callback does that) it lives as long as the job.

The core recorder is synchronous; a process link runs each call on a thread
(``asyncio.to_thread``) so a durable seal's fdatasync never blocks the worker's event loop.
"""

from __future__ import annotations

import asyncio
import atexit
import hashlib
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

from .._lifecycle import Resource
from ..recorder import Recorder, SiblingOutput, StagedCall

__all__ = [
    "LinkMode",
    "RecorderLink",
    "RecorderService",
    "SealedSibling",
    "TakenPrompt",
    "actor_name",
    "link_for",
]

LinkMode = Literal["auto", "process", "ray"]

#: The Ray namespace of the recorder actors: the driver and every worker must agree on it,
#: whatever namespace verl's own ``ray.init`` picked.
NAMESPACE = "rollout_recovery"


class SealedSibling(Protocol):
    """What a loop reads of a sealed sibling (the recorder's own value has more)."""

    @property
    def prompt_token_ids(self) -> list[int]: ...
    @property
    def completion_token_ids(self) -> list[int]: ...
    @property
    def logprobs(self) -> list[float] | None: ...
    @property
    def reward(self) -> float | None: ...
    @property
    def extra(self) -> dict[str, Any]: ...


class TakenPrompt(Protocol):
    """What a loop reads of a taken prompt: its group, sealed siblings and staged calls."""

    @property
    def group_id(self) -> str: ...
    @property
    def sealed(self) -> Mapping[int, SealedSibling]: ...
    @property
    def staged(self) -> Mapping[int, Sequence[StagedCall]]: ...


class RecorderLink(Protocol):
    """What a recovering loop asks of the job's one recorder."""

    async def take(self, key: str, prompt: object, aliases: Sequence[str]) -> TakenPrompt: ...

    async def stage_call(self, group_id: str, sibling: int, call: StagedCall) -> None: ...

    async def seal(self, group_id: str, sibling: int, output: SiblingOutput) -> SealedSibling: ...

    async def mark_checkpoint(self, tag: str, step: int) -> None: ...


class RecorderService(Resource):
    """A recorder and the calls a loop makes, as plain methods: the body of the Ray actor,
    and of the process link (which calls them on a thread). ``close`` closes the recorder
    (twice is a no-op, as the recorder's own)."""

    def __init__(self, run_dir: str, group_size: int) -> None:
        self._recorder = Recorder.open(run_dir, group_size=group_size)

    def take(self, key: str, prompt: object, aliases: Sequence[str]) -> TakenPrompt:
        return self._recorder.take(key, prompt, aliases=aliases)

    def stage_call(self, group_id: str, sibling: int, call: StagedCall) -> None:
        self._recorder.stage_call(group_id, sibling, call)

    def seal(self, group_id: str, sibling: int, output: SiblingOutput) -> SealedSibling:
        return self._recorder.seal(group_id, sibling, output)

    def mark_checkpoint(self, tag: str, step: int) -> None:
        self._recorder.mark_checkpoint(tag, step=step)

    def close(self) -> None:
        self._recorder.close()


class _ProcessLink:
    def __init__(self, service: RecorderService) -> None:
        self.service = service

    async def take(self, key: str, prompt: object, aliases: Sequence[str]) -> TakenPrompt:
        return await asyncio.to_thread(self.service.take, key, prompt, aliases)

    async def stage_call(self, group_id: str, sibling: int, call: StagedCall) -> None:
        await asyncio.to_thread(self.service.stage_call, group_id, sibling, call)

    async def seal(self, group_id: str, sibling: int, output: SiblingOutput) -> SealedSibling:
        return await asyncio.to_thread(self.service.seal, group_id, sibling, output)

    async def mark_checkpoint(self, tag: str, step: int) -> None:
        await asyncio.to_thread(self.service.mark_checkpoint, tag, step)


class _RayLink:
    def __init__(self, actor: Any) -> None:
        self.actor = actor

    async def take(self, key: str, prompt: object, aliases: Sequence[str]) -> TakenPrompt:
        result: TakenPrompt = await self.actor.take.remote(key, prompt, list(aliases))
        return result

    async def stage_call(self, group_id: str, sibling: int, call: StagedCall) -> None:
        await self.actor.stage_call.remote(group_id, sibling, call)

    async def seal(self, group_id: str, sibling: int, output: SiblingOutput) -> SealedSibling:
        result: SealedSibling = await self.actor.seal.remote(group_id, sibling, output)
        return result

    async def mark_checkpoint(self, tag: str, step: int) -> None:
        await self.actor.mark_checkpoint.remote(tag, step)


_lock = threading.Lock()
_process_links: dict[str, _ProcessLink] = {}


def _close_process_links() -> None:
    with _lock:
        for link in _process_links.values():
            link.service.close()
        _process_links.clear()


atexit.register(_close_process_links)


def actor_name(run_dir: str) -> str:
    """The recorder actor's name: one per run directory (its absolute path)."""
    digest = hashlib.sha256(os.path.abspath(run_dir).encode()).hexdigest()[:16]
    return f"rollout_recovery.recorder.{digest}"


_ray_links: dict[str, _RayLink] = {}


def _ray_link(run_dir: str, group_size: int) -> _RayLink:
    import ray

    path = os.path.abspath(run_dir)
    with _lock:
        link = _ray_links.get(path)
        if link is None:
            service = ray.remote(num_cpus=0, max_restarts=0)(RecorderService)
            actor = service.options(
                name=actor_name(path), namespace=NAMESPACE, get_if_exists=True
            ).remote(path, group_size)
            link = _ray_links[path] = _RayLink(actor)
        return link


def _ray_is_up() -> bool:
    import sys

    ray = sys.modules.get("ray")
    return ray is not None and bool(ray.is_initialized())


def link_for(run_dir: str, group_size: int, *, mode: LinkMode = "auto") -> RecorderLink:
    """The link to the job's recorder of ``run_dir``, opening it on first use.

    ``"auto"`` is ``"ray"`` inside a Ray worker or driver (where verl runs its agent loops)
    and ``"process"`` otherwise.
    """
    if mode == "ray" or (mode == "auto" and _ray_is_up()):
        return _ray_link(run_dir, group_size)
    path = os.path.abspath(run_dir)
    with _lock:
        link = _process_links.get(path)
        if link is None:
            link = _process_links[path] = _ProcessLink(RecorderService(path, group_size))
        return link
