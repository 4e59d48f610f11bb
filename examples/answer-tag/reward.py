"""A format reward: the answer in a tag, ``<answer>...</answer>``.

What a format reward looks like in the wild (DeepSeek-R1, TRL's examples), scaled down for
a random model that never saw the tag: a completion earns partial credit for the longest
start of ``<answer>`` it has written anywhere (``open``: a share of the tag), which is how
a model finds a string by sampling alone, and the rest for a closing tag after a whole
opening one (``closed``). The question's reference answer arrives by its field name and
is not scored here: a format reward checks the shape, not the content.
"""

from __future__ import annotations

OPEN = "<answer>"
CLOSE = "</answer>"


def score(completion: str, reference: str) -> dict[str, float]:
    written = next((size for size in range(len(OPEN), 0, -1) if OPEN[:size] in completion), 0)
    start = completion.find(OPEN)
    closed = start >= 0 and CLOSE in completion[start + len(OPEN) :]
    return {"open": written / len(OPEN), "closed": 1.0 if closed else 0.0}
