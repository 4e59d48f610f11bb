"""Reward metrics: per-group sufficient statistics and their exact pooling across groups.

Groups finish at different times and are trained in batches of unequal sizes, possibly after
a restart. Averaging per-group rates or means would weight a 2-row group like a 16-row one,
so each group records *sums* (count, sum, sum of squares, min, max, penalty counts, effort
length buckets) and a batch pools the sums. The result equals computing over all valid rows
at once. Optional :class:`FinalizedReward` observations add what sums cannot give: medians,
histograms and per-agent breakdowns.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Final

from ..errors import InvalidStateError
from ._final_reward import (
    EFFORT_METRIC_PREFIX,
    LENGTH_REWARD_SUM,
    SHAPED_REWARD_SUM,
    CaptureRewardOutcome,
)
from ._penalties import CAPTURE_PENALTIES
from ._records import FinalizedReward

if TYPE_CHECKING:  # the settings compute these metrics: their type, for the type checker
    from ._settings import CaptureRewardSettings

__all__ = [
    "MetricValue",
    "aggregate_capture_reward_metrics",
    "capture_reward_result_tables",
    "group_reward_metrics",
]

MetricValue = float | list[float]

REWARD_COUNT: Final = "finalize/reward_count"
REWARD_SUM: Final = "finalize/reward_sum"
REWARD_SUMSQ: Final = "finalize/reward_sumsq"
REWARD_MIN: Final = "finalize/reward_min"
REWARD_MAX: Final = "finalize/reward_max"
PENALTY_COUNT_PREFIX: Final = "finalize/penalty_count/"
_BUCKETS: Final = ("low", "high")


def group_reward_metrics(
    outcomes: Sequence[CaptureRewardOutcome], *, settings: CaptureRewardSettings
) -> dict[str, float]:
    """Sufficient statistics of one group's valid rows (placeholders are not passed in).

    Penalty counts appear only for enabled penalties, so disabled ones never show up as a
    misleading 0% rate downstream.
    """
    rewards = [outcome.reward for outcome in outcomes]
    metrics: dict[str, float] = {REWARD_COUNT: float(len(rewards))}
    if rewards:
        metrics[REWARD_SUM] = math.fsum(rewards)
        metrics[REWARD_SUMSQ] = math.fsum(r * r for r in rewards)
        metrics[REWARD_MIN] = min(rewards)
        metrics[REWARD_MAX] = max(rewards)
    for penalty in CAPTURE_PENALTIES:
        if penalty.flag in settings.enabled_penalties:
            metrics[PENALTY_COUNT_PREFIX + penalty.name] = float(
                sum(outcome.counts[penalty.name] for outcome in outcomes)
            )
    for outcome in outcomes:
        for name, value in outcome.metrics.items():
            metrics[name] = metrics.get(name, 0.0) + value
    return metrics


def aggregate_capture_reward_metrics(
    metrics: Mapping[str, Sequence[float]],
    observations: Sequence[FinalizedReward] | None = None,
) -> dict[str, MetricValue]:
    """Pool per-group reward metrics (``{name: [value per group]}``) over all valid rows.

    Returns ``{}`` when no group had a valid row. ``observations``, when given, must be the
    finalized rewards of exactly those valid rows; they add exact medians and histograms,
    overall and per agent.
    """
    count = _row_count(metrics.get(REWARD_COUNT, ()), REWARD_COUNT)
    if observations is not None and len(observations) != count:
        raise InvalidStateError(
            "finalized reward observations must match the valid-row count: "
            f"{len(observations)} observations for {count} valid rows",
            path="$.observations",
        )
    if count == 0:
        return {}
    result: dict[str, MetricValue] = {}
    result.update(_penalty_rates(metrics, count))
    result.update(_pooled_reward_stats(metrics, count))
    if observations is not None:
        result.update(_distribution("total_reward", [o.reward for o in observations]))
        result.update(_per_agent(observations))
    result.update(_effort_metrics(metrics))
    return result


def capture_reward_result_tables(
    observations: Iterable[FinalizedReward],
) -> dict[str, list[str]]:
    """Per agent, one compact JSON row per observation that kept its full result.

    The row is the agent's full result with the *final* reward (not the raw one), the gate
    rollout id as ``ng_rollout_id`` and the canonical ``sample_id`` written over any same-named
    keys. Key: ``"{agent}/full_result"``.
    """
    tables: dict[str, list[str]] = {}
    for observation in observations:
        context = observation.log_context
        if context is None or context.full_result_json is None:
            continue
        row = json.loads(context.full_result_json)
        row["reward"] = observation.reward
        row["ng_rollout_id"] = observation.rollout_id
        row["sample_id"] = observation.sample_id
        tables.setdefault(f"{context.agent_name}/full_result", []).append(
            json.dumps(row, separators=(",", ":"))
        )
    return tables


def _penalty_rates(metrics: Mapping[str, Sequence[float]], count: int) -> dict[str, float]:
    return {
        penalty.metric: math.fsum(metrics[PENALTY_COUNT_PREFIX + penalty.name]) / count
        for penalty in CAPTURE_PENALTIES
        if PENALTY_COUNT_PREFIX + penalty.name in metrics
    }


def _pooled_reward_stats(metrics: Mapping[str, Sequence[float]], count: int) -> dict[str, float]:
    for name in (REWARD_SUM, REWARD_SUMSQ, REWARD_MIN, REWARD_MAX):
        if not metrics.get(name):
            raise InvalidStateError(
                f"group reward metrics report {count} valid rows but no {name!r}", path=f"$.{name}"
            )
    mean = math.fsum(metrics[REWARD_SUM]) / count
    return {
        "total_reward/mean": mean,
        "total_reward/stddev": _sample_stddev(math.fsum(metrics[REWARD_SUMSQ]), mean, count),
        "total_reward/min": min(metrics[REWARD_MIN]),
        "total_reward/max": max(metrics[REWARD_MAX]),
    }


def _sample_stddev(sum_of_squares: float, mean: float, count: int) -> float:
    if count < 2:
        return math.nan  # one row has no spread to estimate; 0.0 would claim certainty
    # max(0, .) because rounding can push E[x^2] - mean^2 slightly below zero.
    population_var = max(0.0, sum_of_squares / count - mean * mean)
    return math.sqrt(population_var * count / (count - 1))


def _distribution(prefix: str, values: Sequence[float]) -> dict[str, MetricValue]:
    """Exact distribution metrics of ``values`` (nonempty); the histogram is the sorted
    values, which any logger can bin."""
    count = len(values)
    mean = math.fsum(values) / count
    return {
        f"{prefix}/count": float(count),
        f"{prefix}/mean": mean,
        f"{prefix}/stddev": _sample_stddev(math.fsum(v * v for v in values), mean, count),
        f"{prefix}/min": min(values),
        f"{prefix}/max": max(values),
        f"{prefix}/median": float(statistics.median(values)),
        f"{prefix}/histogram": sorted(values),
    }


def _per_agent(observations: Sequence[FinalizedReward]) -> dict[str, MetricValue]:
    by_agent: dict[str, list[float]] = defaultdict(list)
    for observation in observations:
        if observation.log_context is not None:
            by_agent[observation.log_context.agent_name].append(observation.reward)
    result: dict[str, MetricValue] = {}
    for agent in sorted(by_agent):
        result.update(_distribution(f"{agent}/reward", by_agent[agent]))
    return result


def _effort_metrics(metrics: Mapping[str, Sequence[float]]) -> dict[str, float]:
    lengths = _effort_lengths(metrics)
    result: dict[str, float] = {}
    for bucket in _BUCKETS:
        rows = lengths[bucket]
        if rows:
            result[f"mean_length_{bucket}"] = math.fsum(rows) / len(rows)
            result[f"median_length_{bucket}"] = float(statistics.median(rows))
    low_rows = len(lengths["low"])
    if low_rows:
        result["mean_length_reward_low"] = math.fsum(metrics.get(LENGTH_REWARD_SUM, ())) / low_rows
        result["mean_reward_low"] = math.fsum(metrics.get(SHAPED_REWARD_SUM, ())) / low_rows
    return result


def _effort_lengths(metrics: Mapping[str, Sequence[float]]) -> dict[str, list[int]]:
    """Rebuild every row's length from ``finalize/effort/{bucket}/{length}`` row counts."""
    lengths: dict[str, list[int]] = {bucket: [] for bucket in _BUCKETS}
    for name, values in metrics.items():
        bucket, _, length_text = name.removeprefix(EFFORT_METRIC_PREFIX).partition("/")
        if not name.startswith(EFFORT_METRIC_PREFIX) or bucket not in lengths:
            continue
        if not (length_text.isascii() and length_text.isdecimal()):
            raise InvalidStateError(
                f"effort bucket metric {name!r} must end in a nonnegative integer length",
                path=f"$.{name}",
            )
        lengths[bucket].extend([int(length_text)] * _row_count(values, name))
    for rows in lengths.values():
        rows.sort()
    return lengths


def _row_count(values: Sequence[float], name: str) -> int:
    """Sum per-group row counts, which must be whole and nonnegative (they count rows)."""
    total = math.fsum(values)
    if any(v < 0 or not float(v).is_integer() for v in values):
        raise InvalidStateError(
            f"{name} must hold nonnegative whole row counts, got {list(values)!r}", path=f"$.{name}"
        )
    return int(total)
