"""A verifiable math reward: the completion's first digit against the row's answer.

The dataset (arithmetic.jsonl) holds each sum a + b for a, b in 0..4, its answer in the
field "answer", which reaches this function by its name. ``correct`` is the check that
can be verified (1.0 for the right sum); ``close`` gives partial credit for a digit near
it, so a random model that cannot add yet still learns which way to move. The reward is
their sum, and each is logged (``reward_components`` in metrics.jsonl).
"""

from __future__ import annotations

import re


def score(completion: str, answer: int) -> dict[str, float]:
    first = re.match(r"\s*(\d)", completion)
    if first is None:
        return {"correct": 0.0, "close": 0.0}
    guess = int(first.group(1))
    return {
        "correct": float(guess == int(answer)),
        "close": 0.5 * max(0.0, 1 - abs(guess - int(answer)) / 5),
    }
