"""Helpers of the ``rollout-recovery serve`` tests.

- ``shape``: a JSON value with its values replaced by their types, keys kept in order and
  list lengths kept, to compare our answers with captured vLLM answers field by field;
- ``load_fixture`` / ``expand``: the captured vLLM exchanges in ``tests/fixtures/vllm``,
  whose long prompts are written as ``"[5] * 510"``;
- ``Gate``: holds the first generation request in flight until the test releases it, so a
  test synchronizes on events, never on sleeps;
- ``peaked_params``: weights that make one thought token and one answer digit nearly
  certain, so a test can tell two policies apart from their tokens.
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

from rollout_recovery.policy._numpy_policy import PARAM_SHAPES
from rollout_recovery.policy._tasks import NUM_DIGITS, NUM_THOUGHT

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"
# Long enough for any test, short enough to surface a hang as a failure.
WAIT_S = 30.0


def load_fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def load_fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text()


def expand(value: Any) -> Any:
    """A fixture's request with an elided id list written out as the list it stands for.

    Long lists of one repeated id are captured as ``"[5] * 510"`` or
    ``"<510 ids: [5, 5, 5]...[5, 5] elided>"``.
    """
    if isinstance(value, dict):
        return {key: expand(item) for key, item in value.items()}
    if isinstance(value, list):
        return [expand(item) for item in value]
    if isinstance(value, str):
        match = re.fullmatch(r"\[(-?\d+)\] \* (\d+)", value)
        if match:
            return [int(match[1])] * int(match[2])
        match = re.fullmatch(r"<(\d+) ids: \[([-\d, ]+)\]\.\.\.\[([-\d, ]+)\] elided>", value)
        if match:
            seen = {int(item) for part in (match[2], match[3]) for item in part.split(",")}
            assert len(seen) == 1, f"cannot expand {value!r}: its ids are not all one id"
            return [seen.pop()] * int(match[1])
    return value


def shape(value: Any) -> Any:
    """Types in place of values; dict keys in order, list lengths kept.

    A dict keyed by tokens (a completion's ``top_logprobs`` entry) is data: only its size
    and value types count.
    """
    if isinstance(value, dict):
        if value and all(key.startswith("token_id:") for key in value):
            return ["token map", [shape(item) for item in value.values()]]
        return [(key, shape(item)) for key, item in value.items()]
    if isinstance(value, list):
        return ["list", [shape(item) for item in value]]
    if value is None:
        return "null"
    return type(value).__name__


class Gate:
    """``on_admitted`` for a server: the first request waits in flight until ``release``."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()
        self._armed = True

    def __call__(self) -> None:
        with self._lock:
            first, self._armed = self._armed, False
        if first:
            self.entered.set()
            if not self.release.wait(WAIT_S):
                raise TimeoutError("the test never released the gated request")


def peaked_params(thought: int, answer: int) -> dict[str, list[list[float]]]:
    """JSON params under which every digit thinks thought ``thought`` and answers ``answer``."""
    thoughts = [[0.0] * NUM_THOUGHT for _ in range(NUM_DIGITS)]
    answers = [[0.0] * NUM_DIGITS for _ in range(NUM_DIGITS)]
    for digit in range(NUM_DIGITS):
        thoughts[digit][thought] = 60.0
        answers[digit][answer] = 60.0
    params = {"thought_logits": thoughts, "answer_logits": answers}
    assert set(params) == set(PARAM_SHAPES)
    return params
