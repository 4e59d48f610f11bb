"""Text-derived reward checks, computed once at seal time.

The agent's output text (Responses-API output items) and the original prompt exist only
while the attempt is being sealed; finalization later sees verified tokens only. So the
text checks run here and their boolean results travel as :class:`RewardChecks`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import msgspec

from ..errors import InvalidStateError

if TYPE_CHECKING:  # the settings carry these checks' record: their type, for the checker
    from ._settings import EffortRewardSettings

__all__ = [
    "RewardChecks",
    "compute_reward_checks",
    "has_duplicated_reasoning",
    "has_empty_final_answer",
    "is_low_effort",
]


class RewardChecks(msgspec.Struct, frozen=True, gc=False, forbid_unknown_fields=True):
    """Text-derived checks computed at seal time, when the agent's output text still exists.

    The final reward is computed later from verified tokens; these flags are the only part of
    the text that survives, so they are persisted with the sealed attempt. One type for the
    one fact wherever it goes: the ledger stores it as is (its schema-3 state holds these
    three keys), the journal's ``Seal`` carries it, and a seal hands it to the reward code.
    A strict Struct, not a dataclass: decoding refuses an unknown or missing key, where
    msgspec would silently drop an unknown key of a dataclass. ``gc=False``: it holds only
    booleans, and a restore builds one per sealed attempt (10^5 of them).
    """

    duplicated_reasoning: bool
    empty_final_answer: bool
    low_effort: bool

    @classmethod
    def from_result(
        cls,
        result: Mapping[str, Any],
        row: Mapping[str, Any],
        *,
        effort: EffortRewardSettings | None = None,
    ) -> RewardChecks:
        """Run all seal-time checks on one agent result and its input row
        (:func:`compute_reward_checks`); ``effort`` is the run's active shaping settings,
        or None when shaping is off."""
        return compute_reward_checks(result, row, effort=effort)

    def __post_init__(self) -> None:
        # ``type(...) is bool`` on purpose: 0/1 would silently pass an isinstance check.
        for name in ("duplicated_reasoning", "empty_final_answer", "low_effort"):
            if type(getattr(self, name)) is not bool:
                raise InvalidStateError(
                    f"reward checks must be booleans; {name}={getattr(self, name)!r} "
                    f"is {type(getattr(self, name)).__name__}",
                    path=f"$.{name}",
                )


def has_duplicated_reasoning(output_items: Sequence[Any]) -> bool:
    """Whether nonempty reasoning is repeated verbatim as the immediately following content.

    Only adjacent pairs count; comparison ignores surrounding whitespace on both sides.
    """
    for item, following in pairwise(output_items):
        reasoning = _reasoning_text(item)
        if reasoning is None:
            continue
        content = _content_text(following)
        if content is None:
            continue
        reasoning, content = reasoning.strip(), content.strip()
        if reasoning and reasoning == content:
            return True
    return False


def has_empty_final_answer(output_items: Sequence[Any]) -> bool:
    """Whether the output has no usable final content, or only whitespace.

    A trailing ``function_call`` is a legitimate ending (the agent handed off to a tool), not
    an empty answer. Otherwise the last item with supported content is the final answer.
    """
    if output_items and _get(output_items[-1], "type") == "function_call":
        return False
    for item in reversed(output_items):
        text = _content_text(item)
        if text is not None:
            return not text.strip()
    return True


def is_low_effort(row: Mapping[str, Any], effort: EffortRewardSettings) -> bool:
    """Classify the original rollout input by the legacy last-user rule.

    The prompt is low effort when the content of the *last* ``user`` message that has a
    ``content`` key contains ``effort.low_string``. Non-string content never matches: the
    legacy rule was a membership test, and list content holds parts, not marker strings.
    """
    content = _last_user_content(_input_messages(row))
    return isinstance(content, str) and effort.low_string in content


def compute_reward_checks(
    result: Mapping[str, Any],
    row: Mapping[str, Any],
    *,
    effort: EffortRewardSettings | None = None,
) -> RewardChecks:
    """Run all seal-time checks on one agent result and its input row.

    ``effort`` is the run's active shaping settings, or ``None`` when shaping is off (then the
    prompt is not inspected and ``low_effort`` is False).
    """
    output = _output_items(result)
    return RewardChecks(
        duplicated_reasoning=has_duplicated_reasoning(output),
        empty_final_answer=has_empty_final_answer(output),
        low_effort=effort is not None and is_low_effort(row, effort),
    )


def _output_items(result: Mapping[str, Any]) -> Sequence[Any]:
    # A missing response or output means the agent produced nothing: that is an empty answer,
    # not a malformed result.
    response = result.get("response")
    output = _get(response, "output")
    if output is None:
        return []
    if not isinstance(output, list):
        raise InvalidStateError(
            f"result response.output must be a list, got {type(output).__name__}",
            path="$.response.output",
        )
    return output


def _input_messages(row: Mapping[str, Any]) -> Sequence[Any]:
    params = row.get("responses_create_params")
    if not isinstance(params, Mapping) or "input" not in params:
        raise InvalidStateError(
            "effort classification needs row['responses_create_params']['input'], got "
            f"responses_create_params={params!r}",
            path="$.responses_create_params.input",
        )
    messages = params["input"]
    # A plain-string input has no user message with a role, hence no marker to find.
    return messages if isinstance(messages, list) else []


def _last_user_content(messages: Sequence[Any]) -> object:
    for message in reversed(messages):
        if isinstance(message, Mapping) and message.get("role") == "user" and "content" in message:
            return message["content"]
    return ""


def _reasoning_text(item: object) -> str | None:
    if _get(item, "type") != "reasoning":
        return None
    summary = _get(item, "summary")
    if not isinstance(summary, list) or not summary:
        return None
    text = _get(summary[0], "text")
    return text if isinstance(text, str) else None


def _content_text(item: object) -> str | None:
    """The item's text content: a string, or the ``text`` of its first content part."""
    content = _get(item, "content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        text = _get(content[0], "text")
        if isinstance(text, str):
            return text
    return None


def _get(value: object, key: str) -> Any:
    return value.get(key) if isinstance(value, Mapping) else None
