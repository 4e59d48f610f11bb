"""The final reward of one verified row: shape, then penalize.

Inputs are the raw reward recorded at seal time, the seal-time :class:`RewardChecks`, the
run's :class:`CaptureRewardSettings` and the verified, linearized token row with its link
spans ``(call_id, carry_len, generated_len)``. Only *generated* tokens are the policy's doing,
so only they can earn the unwanted-token penalty; carried tokens (prompt, tool output,
earlier turns) are ignored.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, NamedTuple

from ..errors import InvalidStateError
from ._checks import RewardChecks
from ._penalties import CAPTURE_PENALTIES, CaptureOptionalPenalty

if TYPE_CHECKING:  # the settings apply this reward: their types, for the type checker
    from ._settings import CaptureRewardSettings, EffortRewardSettings

__all__ = [
    "CaptureRewardOutcome",
    "LinkSpan",
    "effort_length_metric",
    "finalize_capture_reward",
    "generated_segments",
    "has_unwanted_tokens",
    "shape_effort_reward",
]


#: One call of a linearized row's terminal chain, root first, as ``(model_call_id,
#: carry_len, generated_len)``: ``carry_len`` prompt tokens, then ``generated_len``
#: generated ones. Capture's verifier produces them (a named tuple of these fields, on
#: its linearized rollout) and reward finalization walks them.
LinkSpan = tuple[str, int, int]


EFFORT_METRIC_PREFIX = "finalize/effort/"
LENGTH_REWARD_SUM = "finalize/effort/length_reward_sum"
SHAPED_REWARD_SUM = "finalize/effort/reward_sum"


class CaptureRewardOutcome(NamedTuple):
    """What :func:`finalize_capture_reward` decided for one row.

    ``counts`` has one 0/1 entry per penalty name (all three, enabled or not); ``metrics``
    holds this row's effort observations, to be summed per group.
    """

    reward: float
    counts: dict[str, int]
    metrics: dict[str, float]


def shape_effort_reward(
    reward: float, *, length: int, config: EffortRewardSettings
) -> tuple[float, float]:
    """Return ``(shaped_reward, length_reward)`` for a low-effort prompt.

    ``length_reward = min(1, low_weight * (1 - length / low_ub))`` rewards short answers and
    turns negative past ``low_ub``. A positive term scales the reward (so a zero or negative
    reward is not turned into a bonus); a negative term is a flat penalty scaled by
    ``low_penalty``.
    """
    length_reward = min(1.0, config.low_weight * (1.0 - length / config.low_ub))
    shaped = (
        reward + reward * max(length_reward, 0.0) + config.low_penalty * min(length_reward, 0.0)
    )
    return shaped, length_reward


def has_unwanted_tokens(
    generations: Iterable[Sequence[int]], unwanted_ids: Collection[int]
) -> bool:
    """Whether any generated sequence contains an unwanted id (terminal tokens included)."""
    unwanted = frozenset(unwanted_ids)
    return any(not unwanted.isdisjoint(generation) for generation in generations)


def generated_segments(
    token_ids: Sequence[int], link_spans: Sequence[LinkSpan]
) -> Iterator[Sequence[int]]:
    """Yield the policy-generated slice of each call, walking spans over the linearized row.

    The spans must tile the row exactly (they do for a verified row); anything else means the
    caller paired a row with the wrong spans, and penalizing the wrong tokens would be silent.
    """
    total = 0
    for index, span in enumerate(link_spans):
        _call_id, carry_len, generated_len = span
        if type(carry_len) is not int or type(generated_len) is not int:
            raise InvalidStateError(
                f"link span lengths must be ints, got {span!r}", path=f"$.link_spans[{index}]"
            )
        if carry_len < 0 or generated_len < 0:
            raise InvalidStateError(
                f"link span lengths must be nonnegative, got {span!r}",
                path=f"$.link_spans[{index}]",
            )
        total += carry_len + generated_len
    if total != len(token_ids):
        raise InvalidStateError(
            f"link spans cover {total} tokens but the linearized row has {len(token_ids)}",
            path="$.link_spans",
        )
    start = 0
    for _call_id, carry_len, generated_len in link_spans:
        start += carry_len
        yield token_ids[start : start + generated_len]
        start += generated_len


def effort_length_metric(*, low_effort: bool, length: int) -> str:
    """Name of the per-row effort bucket metric; the length is encoded in the name so that
    summing per group keeps a row-exact length histogram (median needs every row)."""
    return f"{EFFORT_METRIC_PREFIX}{'low' if low_effort else 'high'}/{length}"


def finalize_capture_reward(
    reward: float,
    *,
    settings: CaptureRewardSettings,
    checks: RewardChecks | None,
    token_ids: Sequence[int],
    link_spans: Sequence[LinkSpan],
) -> CaptureRewardOutcome:
    """Shape, then penalize: the final reward of one verified row.

    1. Effort shaping (if active) uses the terminal call's generated length.
    2. Each enabled text penalty counts when its seal-time check fired.
    3. The unwanted-token penalty counts when a generated span holds an unwanted id.
    4. Any penalty makes the final reward ``0.0``; otherwise it is the shaped reward.

    Raises :class:`InvalidStateError` ``"missing_reward_checks"`` when the settings need checks
    and none were sealed (e.g. an attempt sealed by an older version).
    """
    if isinstance(reward, bool) or not isinstance(reward, int | float) or math.isnan(reward):
        raise InvalidStateError(f"raw reward must be a number, got {reward!r}", path="$.reward")
    counts: dict[str, int] = {penalty.name: 0 for penalty in CAPTURE_PENALTIES}
    if checks is None and settings.needs_reward_checks:
        # Exactly this text: the finalizer reports it as ``reward_processing:<message>``.
        raise InvalidStateError("missing_reward_checks")
    shaped = float(reward)
    metrics: dict[str, float] = {}
    if settings.effort is not None and checks is not None:
        shaped, metrics = _shape(shaped, settings.effort, checks, link_spans)
    if checks is not None:
        _count_text_penalties(counts, settings, checks)
    if settings.penalty_enabled("unwanted_token") and has_unwanted_tokens(
        generated_segments(token_ids, link_spans), settings.unwanted_tokens
    ):
        counts["unwanted_token"] = 1
    final = 0.0 if any(counts.values()) else shaped
    return CaptureRewardOutcome(final, counts, metrics)


def _shape(
    reward: float,
    effort: EffortRewardSettings,
    checks: RewardChecks,
    link_spans: Sequence[LinkSpan],
) -> tuple[float, dict[str, float]]:
    if not link_spans:
        raise InvalidStateError(
            "effort shaping needs the terminal call's link span, got none", path="$.link_spans"
        )
    # The terminal call's generated tokens are the final answer; earlier turns are work.
    length = link_spans[-1][2]
    metrics = {effort_length_metric(low_effort=checks.low_effort, length=length): 1.0}
    if not checks.low_effort:
        return reward, metrics
    shaped, length_reward = shape_effort_reward(reward, length=length, config=effort)
    metrics[LENGTH_REWARD_SUM] = length_reward
    metrics[SHAPED_REWARD_SUM] = shaped
    return shaped, metrics


def _count_text_penalties(
    counts: dict[str, int], settings: CaptureRewardSettings, checks: RewardChecks
) -> None:
    fired: dict[CaptureOptionalPenalty, bool] = {
        "duplicated_reasoning": checks.duplicated_reasoning,
        "empty_final_answer": checks.empty_final_answer,
    }
    for name, hit in fired.items():
        if hit and settings.penalty_enabled(name):
            counts[name] = 1
