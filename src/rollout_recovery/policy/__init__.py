"""The learner side of ``rollout-recovery run``: synthetic tasks, a numpy policy, GRPO.

:class:`TaskSet` is the deterministic prompt dataset (one hidden digit per prompt, answer
``correct_answer(d)``); :class:`PolicySnapshot` is an immutable tabular softmax policy that
samples tokens with exact logprobs and recomputes them from a canonical row;
:class:`NumpyGRPOTrainer` implements the :class:`Trainer` protocol with the clipped
importance-ratio GRPO objective and hand-derived gradients; it bounds the log-ratio
(``MAX_LOG_RATIO``), never applies a non-finite update, and declares training diverged
after ``DEFAULT_DIVERGED_AFTER`` skipped steps in a row.
"""

from ._config import PolicyConfig, TaskConfig
from ._numpy_policy import PARAM_SHAPES, PolicySnapshot
from ._protocol import FileStateTrainer, Trainer, TrainSample
from ._tasks import (
    ANSWER,
    ANSWER_TOKENS,
    DIGIT_BASE,
    EOS,
    NUM_DIGITS,
    NUM_THOUGHT,
    THINK,
    THOUGHT_BASE,
    VOCAB_SIZE,
    TaskSet,
    prompt_digit,
    render,
)
from ._trainer import NumpyGRPOTrainer

__all__ = [
    "ANSWER",
    "ANSWER_TOKENS",
    "DIGIT_BASE",
    "EOS",
    "NUM_DIGITS",
    "NUM_THOUGHT",
    "PARAM_SHAPES",
    "THINK",
    "THOUGHT_BASE",
    "VOCAB_SIZE",
    "FileStateTrainer",
    "NumpyGRPOTrainer",
    "PolicyConfig",
    "PolicySnapshot",
    "TaskConfig",
    "TaskSet",
    "TrainSample",
    "Trainer",
    "prompt_digit",
    "render",
]
