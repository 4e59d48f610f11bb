"""GRPO on the tabular policy: the clipped importance-ratio objective, gradients by hand.

Per generated token, ``ratio = exp(logp_new - logp_captured)`` and the loss is
``-mean(min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A))`` over every generated token of
the batch. For a softmax table, ``d logp[c] / d logits[j] = 1[j == c] - p[j]``, and the
objective's derivative w.r.t. ``logp_new`` is ``ratio * A`` wherever the unclipped term is
the minimum and 0 where the clipped term wins strictly; that is all the autograd needed.
Adam, because the tables' gradients differ by orders of magnitude between digits seen
often and rarely, and Adam's per-parameter scale makes one learning rate fit both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import InvalidArgumentError, InvalidStateError
from ._numpy_policy import (
    KIND_ANSWER,
    KIND_THOUGHT,
    PARAM_SHAPES,
    PolicySnapshot,
    initial_params,
    log_softmax,
    row_token_contexts,
)
from ._protocol import TrainSample
from ._tasks import VOCAB_SIZE

__all__ = ["DEFAULT_CLIP_EPSILON", "DEFAULT_LEARNING_RATE", "NumpyGRPOTrainer"]

DEFAULT_LEARNING_RATE = 0.3
DEFAULT_CLIP_EPSILON = 0.2

# Which table each trainable token kind indexes.
_KIND_TABLE = {KIND_THOUGHT: "thought_logits", KIND_ANSWER: "answer_logits"}


class _Batch:
    """Every generated token of a batch, flattened: context, captured logprob, advantage."""

    __slots__ = ("advantages", "captured", "columns", "digits", "kinds")

    def __init__(self, samples: Sequence[TrainSample]) -> None:
        digits, kinds, columns, captured, advantages = [], [], [], [], []
        for index, sample in enumerate(samples):
            if not np.isfinite(sample.advantage):
                raise InvalidArgumentError(f"sample {index} has a non-finite advantage")
            digit, row_kinds, row_columns = row_token_contexts(sample.token_ids, sample.token_mask)
            logprobs = np.asarray(sample.logprobs, dtype=np.float64)
            if logprobs.shape != row_kinds.shape:
                raise InvalidArgumentError(
                    f"sample {index}: logprobs length differs from token_ids"
                )
            generated = row_kinds >= 0
            count = int(generated.sum())
            digits.append(np.full(count, digit, dtype=np.int64))
            kinds.append(row_kinds[generated])
            columns.append(row_columns[generated])
            captured.append(logprobs[generated])
            advantages.append(np.full(count, float(sample.advantage)))
        empty_i = np.zeros(0, dtype=np.int64)
        empty_f = np.zeros(0, dtype=np.float64)
        self.digits = np.concatenate([empty_i, *digits])
        self.kinds = np.concatenate([empty_i, *kinds])
        self.columns = np.concatenate([empty_i, *columns])
        self.captured = np.concatenate([empty_f, *captured])
        self.advantages = np.concatenate([empty_f, *advantages])

    @property
    def tokens(self) -> int:
        return int(self.kinds.shape[0])


class NumpyGRPOTrainer:
    """Implements :class:`~rollout_recovery.policy.Trainer` for :class:`PolicySnapshot`.

    ``epochs`` gradient steps per ``train_step`` on the same batch (1 is plain on-policy
    GRPO; more makes the clip bite). ``init_std`` is the spread of the seeded initial
    logits (0 gives exactly uniform tables).
    """

    def __init__(
        self,
        *,
        seed: int,
        learning_rate: float = DEFAULT_LEARNING_RATE,
        clip_epsilon: float = DEFAULT_CLIP_EPSILON,
        epochs: int = 1,
        init_std: float = 0.01,
        adam_beta1: float = 0.9,
        adam_beta2: float = 0.999,
        adam_eps: float = 1e-8,
    ) -> None:
        if not learning_rate > 0:
            raise InvalidArgumentError(f"learning_rate must be > 0, got {learning_rate!r}")
        if not 0 < clip_epsilon < 1:
            raise InvalidArgumentError(f"clip_epsilon must be in (0, 1), got {clip_epsilon!r}")
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
            raise InvalidArgumentError(f"epochs must be a positive int, got {epochs!r}")
        if not init_std >= 0:
            raise InvalidArgumentError(f"init_std must be >= 0, got {init_std!r}")
        if not (0 <= adam_beta1 < 1 and 0 <= adam_beta2 < 1 and adam_eps > 0):
            raise InvalidArgumentError("adam betas must be in [0, 1) and adam_eps > 0")
        self._lr = float(learning_rate)
        self._eps = float(clip_epsilon)
        self._epochs = epochs
        self._beta1 = float(adam_beta1)
        self._beta2 = float(adam_beta2)
        self._adam_eps = float(adam_eps)
        self._params = initial_params(seed, init_std)
        self._m = {name: np.zeros(shape) for name, shape in PARAM_SHAPES.items()}
        self._v = {name: np.zeros(shape) for name, shape in PARAM_SHAPES.items()}
        self._adam_step = 0
        self._version = 0
        self._snapshot: PolicySnapshot | None = None

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def vocab_size(self) -> int:
        return VOCAB_SIZE

    def weights(self) -> PolicySnapshot:
        """The current weights; one snapshot per version, shared by every caller."""
        if self._snapshot is None or self._snapshot.version != self._version:
            self._snapshot = PolicySnapshot(self._version, self._params)
        return self._snapshot

    # -- the objective --------------------------------------------------------------------

    def _objective(
        self, batch: _Batch
    ) -> tuple[float, dict[str, npt.NDArray[np.float64]], dict[str, float]]:
        """Loss, gradient per table and diagnostics at the current params."""
        logps = {name: log_softmax(self._params[name]) for name in PARAM_SHAPES}
        new = np.zeros(batch.tokens)
        for kind, name in _KIND_TABLE.items():
            where = batch.kinds == kind
            new[where] = logps[name][batch.digits[where], batch.columns[where]]
        ratio = np.exp(new - batch.captured)
        adv = batch.advantages
        unclipped = ratio * adv
        clipped = np.clip(ratio, 1.0 - self._eps, 1.0 + self._eps) * adv
        objective = np.minimum(unclipped, clipped)
        loss = -float(objective.mean())
        # d loss / d logp_new per token: where the clipped term wins strictly the objective
        # is flat in logp, elsewhere it is ratio * A (times -1/n for the mean).
        active = unclipped <= clipped
        dlogp = np.where(active, -unclipped / batch.tokens, 0.0)
        grads: dict[str, npt.NDArray[np.float64]] = {}
        for kind, name in _KIND_TABLE.items():
            where = batch.kinds == kind
            grad = np.zeros(PARAM_SHAPES[name])
            # sum_t g_t * (onehot(c_t) - p[d_t]): the one-hot part scatters, the softmax
            # part only depends on the digit, so it is one weighted row per digit.
            np.add.at(grad, (batch.digits[where], batch.columns[where]), dlogp[where])
            per_digit = np.bincount(
                batch.digits[where], weights=dlogp[where], minlength=grad.shape[0]
            )
            grad -= per_digit[:, None] * np.exp(logps[name])
            grads[name] = grad
        outside = np.abs(ratio - 1.0) > self._eps
        diagnostics = {
            "clip_fraction": float(outside.mean()),
            "mean_ratio": float(ratio.mean()),
            "max_ratio": float(ratio.max()),
        }
        return loss, grads, diagnostics

    def loss_and_grad(
        self, samples: Sequence[TrainSample]
    ) -> tuple[float, dict[str, npt.NDArray[np.float64]]]:
        """The objective and its analytic gradient at the current params (no update)."""
        batch = _Batch(samples)
        if batch.tokens == 0:
            return 0.0, {name: np.zeros(shape) for name, shape in PARAM_SHAPES.items()}
        loss, grads, _ = self._objective(batch)
        return loss, grads

    def _adam(self, grads: Mapping[str, npt.NDArray[np.float64]]) -> None:
        self._adam_step += 1
        b1, b2, t = self._beta1, self._beta2, self._adam_step
        for name, grad in grads.items():
            self._m[name] = b1 * self._m[name] + (1.0 - b1) * grad
            self._v[name] = b2 * self._v[name] + (1.0 - b2) * grad * grad
            m_hat = self._m[name] / (1.0 - b1**t)
            v_hat = self._v[name] / (1.0 - b2**t)
            self._params[name] = self._params[name] - self._lr * m_hat / (
                np.sqrt(v_hat) + self._adam_eps
            )

    def train_step(self, samples: Sequence[TrainSample]) -> dict[str, float]:
        """``epochs`` Adam steps on ``samples``; the version advances by one regardless.

        Metrics are measured before the first update (what the behaviour data looked like
        to the current policy). An empty batch (or one without generated tokens) changes
        no parameter and no optimizer state, but still advances the version. A sample this
        policy cannot have produced raises ``ValueError`` before anything changes.
        """
        batch = _Batch(samples)
        metrics = {
            "loss": 0.0,
            "clip_fraction": 0.0,
            "mean_ratio": 1.0,
            "max_ratio": 1.0,
            "grad_norm": 0.0,
            "tokens": float(batch.tokens),
            "samples": float(len(samples)),
        }
        if batch.tokens:
            for epoch in range(self._epochs):
                loss, grads, diagnostics = self._objective(batch)
                if epoch == 0:
                    norm = float(np.sqrt(sum(float((g * g).sum()) for g in grads.values())))
                    metrics.update(diagnostics, loss=loss, grad_norm=norm)
                self._adam(grads)
        self._version += 1
        return metrics

    # -- state ----------------------------------------------------------------------------

    def state(self) -> dict[str, npt.NDArray[Any]]:
        """Everything to resume bit-for-bit, as plain arrays (``np.savez``-able, no pickle).

        Hyperparameters are not state: they come from the job config on resume.
        """
        out: dict[str, npt.NDArray[Any]] = {
            "version": np.array(self._version, dtype=np.int64),
            "adam_step": np.array(self._adam_step, dtype=np.int64),
        }
        for name in PARAM_SHAPES:
            out[f"param.{name}"] = self._params[name].copy()
            out[f"adam_m.{name}"] = self._m[name].copy()
            out[f"adam_v.{name}"] = self._v[name].copy()
        return out

    def load_state(self, state: Mapping[str, npt.NDArray[Any]]) -> None:
        """Restore :meth:`state` output exactly; refuses a bad state before changing anything.

        Raises ``ValueError`` naming the first missing, unexpected, misshaped, mistyped or
        non-finite key.
        """
        expected: dict[str, tuple[tuple[int, ...], str]] = {
            "version": ((), "i"),
            "adam_step": ((), "i"),
        }
        for name, shape in PARAM_SHAPES.items():
            for prefix in ("param", "adam_m", "adam_v"):
                expected[f"{prefix}.{name}"] = (shape, "f")
        for key in sorted(expected):
            if key not in state:
                raise InvalidStateError(f"trainer state is missing key {key!r}")
        for key in sorted(state):
            if key not in expected:
                raise InvalidStateError(f"trainer state has unexpected key {key!r}")
        loaded: dict[str, npt.NDArray[Any]] = {}
        for key in sorted(expected):
            shape, kind = expected[key]
            value = state[key]
            if not isinstance(value, np.ndarray):
                raise InvalidStateError(f"trainer state key {key!r} must be a numpy array")
            if value.shape != shape or value.dtype.kind not in ("iu" if kind == "i" else "f"):
                raise InvalidStateError(
                    f"trainer state key {key!r} must be a {'integer' if kind == 'i' else 'float'}"
                    f" array of shape {shape}, got {value.dtype} {value.shape}"
                )
            if kind == "f" and not np.isfinite(value).all():
                raise InvalidStateError(f"trainer state key {key!r} must be finite")
            if kind == "i" and int(value) < 0:
                raise InvalidStateError(f"trainer state key {key!r} must be >= 0")
            if key.startswith("adam_v.") and (value < 0).any():
                raise InvalidStateError(f"trainer state key {key!r} must be >= 0")
            loaded[key] = value
        self._version = int(loaded["version"])
        self._adam_step = int(loaded["adam_step"])
        for name in PARAM_SHAPES:
            self._params[name] = np.array(loaded[f"param.{name}"], dtype=np.float64)
            self._m[name] = np.array(loaded[f"adam_m.{name}"], dtype=np.float64)
            self._v[name] = np.array(loaded[f"adam_v.{name}"], dtype=np.float64)
        self._snapshot = None
