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
from ._numpy_policy import (
    KIND_ANSWER,
    KIND_FIXED,
    KIND_PROMPT,
    KIND_THOUGHT,
    PARAM_SHAPES,
    PolicySnapshot,
    initial_params,
    log_softmax,
    row_token_contexts,
)
from ._protocol import FileStateTrainer, Trainer, TrainSample
from ._tasks import (
    ANSWER,
    ANSWER_TOKENS,
    BOS,
    DIGIT_BASE,
    EOS,
    FILLER_BASE,
    NUM_DIGITS,
    NUM_FILLER,
    NUM_THOUGHT,
    THINK,
    THOUGHT_BASE,
    VOCAB_SIZE,
    TaskSet,
    correct_answer,
    digit_token,
    prompt_digit,
    render,
)
from ._trainer import (
    DEFAULT_CLIP_EPSILON,
    DEFAULT_DIVERGED_AFTER,
    DEFAULT_LEARNING_RATE,
    MAX_LOG_RATIO,
    NumpyGRPOTrainer,
)

__all__ = [
    "ANSWER",
    "ANSWER_TOKENS",
    "BOS",
    "DEFAULT_CLIP_EPSILON",
    "DEFAULT_DIVERGED_AFTER",
    "DEFAULT_LEARNING_RATE",
    "DIGIT_BASE",
    "EOS",
    "FILLER_BASE",
    "KIND_ANSWER",
    "KIND_FIXED",
    "KIND_PROMPT",
    "KIND_THOUGHT",
    "MAX_LOG_RATIO",
    "NUM_DIGITS",
    "NUM_FILLER",
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
    "correct_answer",
    "digit_token",
    "initial_params",
    "log_softmax",
    "prompt_digit",
    "render",
    "row_token_contexts",
]
