"""A reward function of one's own: ``[reward]`` (:class:`RewardConfig`), the function it
names loaded and called off the loop.

A bottom module: the run config (``control``) holds the section and the dataset task
(``llm``) calls the function, so both read it here, under no room's facade.

:meth:`RewardFunction.load` imports ``"file.py:name"`` (by its path) or
``"package.module:name"`` and checks, before any step runs, that every parameter the
function requires is a name it will be given (``prompt``, ``completion``,
``completion_ids``, the dataset's fields): a typo is a ``ConfigError`` at start, not a
failed completion at every step.

:meth:`RewardFunction.score` runs one call on a daemon thread of its own and awaits it on
the event loop under ``timeout_s`` (the loop's clock), so a slow reward never holds up
the loop (deadlines, seals, checkpoints) and a hung one costs its completion, not the
run. Python cannot stop a thread: a call past its timeout is left running, and a daemon
thread never keeps a finished job from exiting. Whatever the function does (raises,
returns NaN, a string, a mapping with a bad value) becomes a :class:`RewardFailure` value
naming it; only a number, or a mapping of named numbers (components, summed), is a
:class:`RewardValue`. At the episode's boundary ``score`` returns the reward and its
components, or raises the failure as ``RewardFunctionError``, which ``run_episode``
turns into a sealed failed attempt (as ``GenerationError`` leaves an attempt's frames).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib
import importlib.util
import inspect
import logging
import math
import sys
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Final

from msgspec import Meta

from ._clock import off_loop
from ._settings import IDENTITY_WHEN_SET, OPERATIONAL, Section
from .errors import ConfigError, RewardFunctionError

__all__ = ["RewardConfig", "RewardFailure", "RewardFunction", "RewardValue"]

_log = logging.getLogger("rollout_recovery.rewards")

#: The keyword arguments every call gets besides the row's fields.
GIVEN: Final = ("prompt", "completion", "completion_ids")
_PATH = "$.reward.function"
_MAX_DETAIL = 300


@dataclass(frozen=True, slots=True)
class RewardValue:
    """A finite reward and, when the function returned a mapping, its components."""

    reward: float
    components: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RewardFailure:
    """Why a call gave no reward: ``reason`` is ``reward_raised``, ``reward_not_finite``,
    ``reward_not_a_number`` or ``reward_timeout``; ``detail`` what it did."""

    reason: str
    detail: str


def _short(text: str) -> str:
    return text if len(text) <= _MAX_DETAIL else text[: _MAX_DETAIL - 3] + "..."


def _number(value: object) -> float | None:
    """``value`` as a float if it is a real number (numpy scalars too), else None."""
    item = getattr(value, "item", None)
    if callable(item) and not isinstance(value, str | bytes):
        try:
            value = item()
        except (TypeError, ValueError):
            return None
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        try:
            return float(value)
        except OverflowError:
            return math.inf
    return None


def judge(returned: object) -> RewardValue | RewardFailure:
    """What a call returned, as a reward or as the reason it is none."""
    if isinstance(returned, Mapping):
        components: dict[str, float] = {}
        for name, value in returned.items():
            number = _number(value)
            if not isinstance(name, str) or not name:
                return RewardFailure(
                    "reward_not_a_number", _short(f"component name {name!r} is not a string")
                )
            if number is None:
                return RewardFailure(
                    "reward_not_a_number",
                    _short(f"component {name!r} is a {type(value).__name__}: {value!r}"),
                )
            if not math.isfinite(number):
                return RewardFailure("reward_not_finite", f"component {name!r} is {number}")
            components[name] = number
        if not components:
            return RewardFailure("reward_not_a_number", "returned an empty mapping")
        try:
            total = math.fsum(components.values())
        except OverflowError:
            total = math.inf
        if not math.isfinite(total):
            return RewardFailure("reward_not_finite", f"the components sum to {total}")
        return RewardValue(total, components)
    number = _number(returned)
    if number is None:
        return RewardFailure(
            "reward_not_a_number",
            _short(f"returned a {type(returned).__name__}: {returned!r}"),
        )
    if not math.isfinite(number):
        return RewardFailure("reward_not_finite", f"returned {number}")
    return RewardValue(number)


class RewardFunction:
    """One loaded reward function (see the module docstring)."""

    def __init__(
        self,
        function: Callable[..., object],
        *,
        name: str,
        timeout_s: float,
        accepts: frozenset[str] | None,
    ) -> None:
        self._function = function
        self.name = name
        self.timeout_s = timeout_s
        #: The keyword names it takes; None: any (it has ``**kwargs``).
        self._accepts = accepts
        self._warned: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    @classmethod
    def load(
        cls, spec: str, *, timeout_s: float, fields: Collection[str]
    ) -> RewardFunction:
        """Import ``spec`` and check its parameters against ``GIVEN`` and ``fields``."""
        target, sep, name = spec.rpartition(":")
        if not sep or not target or not name.isidentifier():
            raise ConfigError(
                f"{spec!r} is not 'file.py:name' or 'package.module:name'", path=_PATH
            )
        clash = sorted(set(GIVEN) & set(fields))
        if clash:
            raise ConfigError(
                f"the dataset has a field named {clash[0]!r}, which is also what the reward "
                f"function gets as {', '.join(GIVEN)}: rename that column",
                path=_PATH,
            )
        module = _import(target)
        function = getattr(module, name, None)
        if function is None or not callable(function):
            raise ConfigError(f"{target!r} has no function {name!r}", path=_PATH)
        accepts = _check_parameters(function, spec, {*GIVEN, *fields})
        return cls(function, name=spec, timeout_s=timeout_s, accepts=accepts)

    def call(self, arguments: Mapping[str, Any]) -> RewardValue | RewardFailure:
        """One call in the caller's thread; every outcome is a value."""
        given = (
            dict(arguments)
            if self._accepts is None
            else {k: v for k, v in arguments.items() if k in self._accepts}
        )
        try:
            returned = self._function(**given)
        except Exception as error:  # the user's code: any failure is that completion's
            outcome: RewardValue | RewardFailure = RewardFailure(
                "reward_raised", _short(f"{type(error).__name__}: {error}")
            )
        else:
            outcome = judge(returned)
        if isinstance(outcome, RewardFailure):
            self._warn_once(outcome)
        return outcome

    async def score(self, arguments: Mapping[str, Any]) -> tuple[float, Mapping[str, float]]:
        """The reward and its components (empty for a plain number), from :meth:`call` on
        a daemon thread awaited for at most ``timeout_s``; a ``RewardFunctionError``
        naming the failure otherwise."""
        outcome = await self._off_loop(arguments)
        if isinstance(outcome, RewardFailure):
            raise RewardFunctionError(outcome.reason, outcome.detail)
        return outcome.reward, outcome.components

    async def _off_loop(self, arguments: Mapping[str, Any]) -> RewardValue | RewardFailure:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[RewardValue | RewardFailure] = loop.create_future()
        off_loop(done)

        def settle(outcome: RewardValue | RewardFailure) -> None:
            if not done.done():  # past its timeout nobody waits for it
                done.set_result(outcome)

        def work() -> None:
            outcome = self.call(arguments)
            # The loop may have closed while the call ran: then nobody waits for it.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(settle, outcome)

        threading.Thread(target=work, name=f"reward {self.name}", daemon=True).start()
        try:
            async with asyncio.timeout(self.timeout_s):
                return await done
        except TimeoutError:
            failure = RewardFailure(
                "reward_timeout", f"still running after [reward] timeout_s = {self.timeout_s:g}"
            )
            self._warn_once(failure)
            return failure
        finally:
            if not done.done():
                done.cancel()  # lets a virtual clock move again

    def _warn_once(self, failure: RewardFailure) -> None:
        """The first failure of each kind is logged in full; the rest are counted as
        ``placeholder_reasons`` in the step metrics."""
        kind = (failure.reason, failure.detail.partition(":")[0])
        with self._lock:
            if kind in self._warned:
                return
            self._warned.add(kind)
        _log.warning(
            "reward function %s: %s (%s); that completion trains as a masked placeholder, "
            "the run goes on (later ones of this kind are counted in placeholder_reasons)",
            self.name,
            failure.reason,
            failure.detail,
        )


def _import(target: str) -> Any:
    """A module by file path (``x.py``, or anything with a ``/``) or by import name."""
    if target.endswith(".py") or "/" in target:
        path = Path(target).expanduser()
        if not path.is_file():
            raise ConfigError(f"reward file {str(path)!r} does not exist", path=_PATH)
        # A name of its own per file: two reward files called reward.py do not collide.
        digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
        module_name = f"rollout_recovery_reward_{digest}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise ConfigError(f"cannot load {str(path)!r} as Python", path=_PATH)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # dataclasses and pickling look modules up
        try:
            spec.loader.exec_module(module)
        except Exception as error:
            sys.modules.pop(module_name, None)
            raise ConfigError(
                f"importing {str(path)!r} failed: {type(error).__name__}: {error}", path=_PATH
            ) from error
        return module
    try:
        return importlib.import_module(target)
    except Exception as error:
        raise ConfigError(
            f"importing {target!r} failed: {type(error).__name__}: {error}", path=_PATH
        ) from error


def _check_parameters(
    function: Callable[..., object], spec: str, available: set[str]
) -> frozenset[str] | None:
    """The keyword names the function takes (None: all, it has ``**kwargs``); refuses a
    required parameter it would not be given."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None  # a builtin without a signature: give it everything
    accepts: set[str] = set()
    variadic = False
    for parameter in signature.parameters.values():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            variadic = True
        elif parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            continue
        elif parameter.kind is inspect.Parameter.POSITIONAL_ONLY:
            if parameter.default is inspect.Parameter.empty:
                raise ConfigError(
                    f"{spec}: parameter {parameter.name!r} is positional-only; the reward "
                    "function is called with keyword arguments",
                    path=_PATH,
                )
        else:
            accepts.add(parameter.name)
            if parameter.name not in available and parameter.default is inspect.Parameter.empty:
                raise ConfigError(
                    f"{spec} requires {parameter.name!r}, which it will not be given: it gets "
                    f"{', '.join(sorted(available))}",
                    path=_PATH,
                )
    return None if variadic else frozenset(accepts)


class RewardConfig(Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[reward]``: what scores a completion of the dataset task.

    ``function`` is ``"path/to/file.py:name"`` (relative to the config file's directory)
    or ``"package.module:name"`` (importable). It is called with keyword arguments:
    ``prompt`` (the row's prompt field, or its messages), ``completion`` (the generated
    text), ``completion_ids`` (the generated token ids) and every other field of the row
    by its name; a function without ``**kwargs`` gets only the names it declares. It
    returns a number, or a mapping of named numbers (components: their sum is the
    reward, and each is logged). One that raises, returns NaN, infinity or no number, or
    runs past ``timeout_s`` fails that completion alone: it trains as a masked
    placeholder whose reason says why (``data_error:reward_raised``, ...).
    """

    #: The reward function; required by the dataset task, refused by the others.
    function: Annotated[str, Meta(max_length=4096), IDENTITY_WHEN_SET] = ""
    #: How long one call may run; past it the completion fails with
    #: ``data_error:reward_timeout`` (the call's thread is left to finish on its own).
    timeout_s: Annotated[float, Meta(gt=0, le=3600), OPERATIONAL] = 30.0

    def check(self, task_kind: str) -> None:
        """Refuse a dataset task without a function, and a function for another task."""
        if task_kind == "dataset" and not self.function:
            raise ConfigError(
                '[task] kind = "dataset" needs [reward] function = "file.py:name" (or '
                '"package.module:name"): what scores each completion',
                path="$.reward.function",
            )
        if task_kind != "dataset" and self.function:
            raise ConfigError(
                f'[reward] function is for [task] kind = "dataset"; task kind {task_kind!r} '
                "has its own reward: remove it",
                path="$.reward.function",
            )

    def load(self, fields: Collection[str]) -> RewardFunction:
        """The function, imported and checked against the names it will be given:
        ``prompt``, ``completion``, ``completion_ids`` and the dataset's ``fields``
        (:meth:`RewardFunction.load`; its refusals are ``ConfigError``)."""
        return RewardFunction.load(self.function, timeout_s=self.timeout_s, fields=fields)
