"""The learner side of ``rollout-recovery run``: synthetic tasks, a numpy policy, GRPO.

:class:`TaskSet` is the deterministic prompt dataset (one hidden digit per prompt, a fixed
rule for the answer) and says how an episode asks for thinking and for the answer;
:class:`PolicySnapshot` is an immutable tabular softmax policy that samples tokens with
exact logprobs and recomputes them from a canonical row; :class:`NumpyGRPOTrainer`
implements the :class:`Trainer` protocol with the clipped importance-ratio GRPO objective
and hand-derived gradients; it bounds the log-ratio, never applies a non-finite update, and
declares training diverged after too many skipped steps in a row. The task's vocabulary
(token ids) stays private: other packages go through these classes (``TaskSet.render``,
``TaskSet.prompt_digit``, ``PolicySnapshot.param_shapes``).
"""

from ._config import PolicyConfig, TaskConfig
from ._numpy_policy import PolicySnapshot
from ._protocol import FileStateTrainer, Trainer, TrainSample
from ._tasks import TaskSet
from ._trainer import NumpyGRPOTrainer

__all__ = [
    "FileStateTrainer",
    "NumpyGRPOTrainer",
    "PolicyConfig",
    "PolicySnapshot",
    "TaskConfig",
    "TaskSet",
    "TrainSample",
    "Trainer",
]
