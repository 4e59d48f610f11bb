"""``[reward]``: a reward function of one's own, for ``[task] kind = "dataset"``.

Light on purpose: the run config imports this section on every install, so loading the
function (:mod:`._function`, which imports the user's code) happens only when a job is
built (:meth:`RewardConfig.load`).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Annotated

from msgspec import Meta

from .._settings import OPERATIONAL, Section
from ..errors import ConfigError
from ._function import RewardFunction

__all__ = ["RewardConfig"]


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
    function: Annotated[str, Meta(max_length=4096)] = ""
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
        (``_function.RewardFunction.load``; its refusals are ``ConfigError``)."""
        return RewardFunction.load(self.function, timeout_s=self.timeout_s, fields=fields)
