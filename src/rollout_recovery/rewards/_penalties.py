"""The penalties a capture reward can apply: one table, read by the settings that switch
them on, the reward that applies them and the metrics that count them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

__all__ = ["CAPTURE_PENALTIES", "CaptureOptionalPenalty", "CapturePenalty"]

CaptureOptionalPenalty = Literal["duplicated_reasoning", "empty_final_answer", "unwanted_token"]


@dataclass(frozen=True, slots=True)
class CapturePenalty:
    """One supported penalty: its count name, config flag, legacy metric name and input kind.

    ``kind == "text"`` penalties are decided at seal time from :class:`RewardChecks`;
    ``kind == "token"`` penalties are decided at finalization from verified tokens.
    """

    name: CaptureOptionalPenalty
    flag: str
    metric: str
    kind: Literal["text", "token"]


# Order matters: it is the order of ``enabled_penalties`` and of persisted flags.
CAPTURE_PENALTIES: Final[tuple[CapturePenalty, ...]] = (
    CapturePenalty(
        "duplicated_reasoning",
        "penalize_duplicated_reasoning",
        "reasoning_equal_to_final_answer_rate",
        "text",
    ),
    CapturePenalty(
        "empty_final_answer", "penalize_empty_final_answer", "empty_final_answer_rate", "text"
    ),
    CapturePenalty("unwanted_token", "penalize_unwanted_tokens", "unwanted_token_rate", "token"),
)
