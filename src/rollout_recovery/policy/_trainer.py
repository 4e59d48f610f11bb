"""GRPO on the tabular policy: the clipped importance-ratio objective, gradients by hand.

Per generated token, ``ratio = exp(logp_new - logp_captured)`` and the loss is
``-mean(min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A))`` over every generated token of
the batch. For a softmax table, ``d logp[c] / d logits[j] = 1[j == c] - p[j]``, and the
objective's derivative w.r.t. ``logp_new`` is ``ratio * A`` wherever the unclipped term is
the minimum and 0 where the clipped term wins strictly; that is all the autograd needed.
Adam, because the tables' gradients differ by orders of magnitude between digits seen
often and rarely, and Adam's per-parameter scale makes one learning rate fit both.

Two guards keep one bad batch from poisoning the weights. The log-ratio is clamped to
``[-MAX_LOG_RATIO, MAX_LOG_RATIO]`` before it is exponentiated, so a captured logprob of
-9999 (vLLM's value for an impossible token) or -inf gives a large but finite ratio and no
gradient instead of an overflow. And an update whose loss, gradient or resulting optimizer
state is not finite is never applied: the step is skipped and counted, and the
``diverged_after``-th skip in a row raises :class:`TrainingDivergedError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import InvalidArgumentError, InvalidStateError, TrainingDivergedError
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

__all__ = [
    "DEFAULT_CLIP_EPSILON",
    "DEFAULT_DIVERGED_AFTER",
    "DEFAULT_LEARNING_RATE",
    "MAX_LOG_RATIO",
    "NumpyGRPOTrainer",
]

DEFAULT_LEARNING_RATE = 0.3
DEFAULT_CLIP_EPSILON = 0.2
# Consecutive skipped (non-finite) steps at which training is declared diverged: one bad
# batch is survivable, three in a row mean the data or the weights are broken for good.
DEFAULT_DIVERGED_AFTER = 3

# Bound on |logp_new - logp_captured| before exponentiating: exp(9999) overflows to inf
# (and inf * 0 is NaN), exp(20) ~ 4.9e8 keeps ratio * A finite for any advantage GRPO
# produces. The clipped objective is unchanged wherever |log ratio| <= 20, which any
# on-policy or mildly stale batch is by orders of magnitude. Beyond the bound, the clamp
# only touches tokens whose gradient was already 0 or negligible, except one case: above
# exp(20) with A > 0 the clipped term (1 + eps) * A wins (flat, as before); below exp(-20)
# with A < 0 the clipped term (1 - eps) * A wins (flat, as before); below exp(-20) with
# A > 0 the gradient was under 2.1e-9 * |A| per token and is now 0; above exp(20) with
# A < 0 the gradient was ratio * |A|, the value that blew up, and is now 0. The clamp is
# flat beyond the bound, so 0 is the exact gradient of the clamped objective: the token is
# masked out of the update (its ratio is evidence of broken data, not a direction to move
# the policy in), and only its loss term, at most exp(20) * |A|, still shows in the loss.
MAX_LOG_RATIO = 20.0

# State keys a state written by an older version may lack, and the value they then take.
_STATE_DEFAULTS: Mapping[str, npt.NDArray[Any]] = MappingProxyType(
    {"skipped_in_a_row": np.array(0, dtype=np.int64)}
)

# Which table each trainable token kind indexes.
_INT64_MAX = 2**63 - 1
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


class _Update:
    """Parameters, Adam moments and step count: a candidate update, before it is applied."""

    __slots__ = ("adam_step", "m", "params", "v")

    def __init__(
        self,
        params: dict[str, npt.NDArray[np.float64]],
        m: dict[str, npt.NDArray[np.float64]],
        v: dict[str, npt.NDArray[np.float64]],
        adam_step: int,
    ) -> None:
        self.params = params
        self.m = m
        self.v = v
        self.adam_step = adam_step


def _nonfinite_objective(
    epoch: int,
    loss: float,
    grads: Mapping[str, npt.NDArray[np.float64]],
    diagnostics: Mapping[str, float],
) -> str | None:
    """Why an epoch's loss or gradient cannot be applied, or None when all are finite."""
    if not np.isfinite(loss):
        tokens = int(diagnostics["nonfinite_tokens"])
        cause = (
            f"{tokens} token(s) had a non-finite objective (a NaN captured logprob?)"
            if tokens
            else "the sum over tokens overflowed (an extreme advantage?)"
        )
        return f"epoch {epoch}: the loss was {loss}: {cause}"
    for name in sorted(grads):
        if not np.isfinite(grads[name]).all():
            return f"epoch {epoch}: the gradient of {name!r} was not finite"
    return None


def _nonfinite_update(epoch: int, update: _Update) -> str | None:
    """Why an epoch's Adam step cannot be applied, or None when its result is finite."""
    for label, tables in (("parameter", update.params), ("Adam moment", update.m)):
        for name in sorted(tables):
            if not np.isfinite(tables[name]).all():
                return f"epoch {epoch}: the {label} {name!r} would not be finite"
    for name in sorted(update.v):
        if not np.isfinite(update.v[name]).all():
            return (
                f"epoch {epoch}: the Adam second moment of {name!r} would overflow "
                "(a gradient too large to square)"
            )
    return None


class NumpyGRPOTrainer:
    """Implements :class:`~rollout_recovery.policy.Trainer` for :class:`PolicySnapshot`.

    ``epochs`` gradient steps per ``train_step`` on the same batch (1 is plain on-policy
    GRPO; more makes the clip bite). ``init_std`` is the spread of the seeded initial
    logits (0 gives exactly uniform tables). ``diverged_after`` is how many steps in a row
    may have a non-finite update before :meth:`train_step` raises
    :class:`TrainingDivergedError` (the ``diverged_after``-th raises; 1 raises at the
    first).
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
        diverged_after: int = DEFAULT_DIVERGED_AFTER,
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
        if (
            isinstance(diverged_after, bool)
            or not isinstance(diverged_after, int)
            or diverged_after < 1
        ):
            raise InvalidArgumentError(
                f"diverged_after must be a positive int, got {diverged_after!r}"
            )
        self._lr = float(learning_rate)
        self._eps = float(clip_epsilon)
        self._epochs = epochs
        self._beta1 = float(adam_beta1)
        self._beta2 = float(adam_beta2)
        self._adam_eps = float(adam_eps)
        self._diverged_after = diverged_after
        self._params = initial_params(seed, init_std)
        self._m = {name: np.zeros(shape) for name, shape in PARAM_SHAPES.items()}
        self._v = {name: np.zeros(shape) for name, shape in PARAM_SHAPES.items()}
        self._adam_step = 0
        self._version = 0
        self._skipped_in_a_row = 0
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
        self, batch: _Batch, params: Mapping[str, npt.NDArray[np.float64]]
    ) -> tuple[float, dict[str, npt.NDArray[np.float64]], dict[str, float]]:
        """Loss, gradient per table and diagnostics at ``params``.

        May return a non-finite loss or gradient (a NaN captured logprob, an advantage so
        large that a sum overflows); :meth:`train_step` checks before applying anything.
        """
        logps = {name: log_softmax(params[name]) for name in PARAM_SHAPES}
        new = np.zeros(batch.tokens)
        for kind, name in _KIND_TABLE.items():
            where = batch.kinds == kind
            new[where] = logps[name][batch.digits[where], batch.columns[where]]
        # Overflow and NaN are expected here for broken data and handled below, so numpy's
        # warnings would only be noise.
        with np.errstate(over="ignore", invalid="ignore"):
            log_ratio = new - batch.captured  # +-inf for a captured -+inf: clamped below
            clamped = np.abs(log_ratio) > MAX_LOG_RATIO  # False for NaN: it stays NaN
            ratio = np.exp(np.clip(log_ratio, -MAX_LOG_RATIO, MAX_LOG_RATIO))
            adv = batch.advantages
            unclipped = ratio * adv
            clipped = np.clip(ratio, 1.0 - self._eps, 1.0 + self._eps) * adv
            objective = np.minimum(unclipped, clipped)
            loss = -float(objective.mean())
        # d loss / d logp_new per token: where the clipped term wins strictly, or the clamp
        # is active, the objective is flat in logp; elsewhere it is ratio * A (times -1/n
        # for the mean).
        active = (unclipped <= clipped) & ~clamped
        dlogp = np.where(active, -unclipped / batch.tokens, 0.0)
        grads: dict[str, npt.NDArray[np.float64]] = {}
        for kind, name in _KIND_TABLE.items():
            where = batch.kinds == kind
            grad = np.zeros(PARAM_SHAPES[name])
            # sum_t g_t * (onehot(c_t) - p[d_t]): the one-hot part scatters, the softmax
            # part only depends on the digit, so it is one weighted row per digit.
            with np.errstate(over="ignore", invalid="ignore"):
                np.add.at(grad, (batch.digits[where], batch.columns[where]), dlogp[where])
                per_digit = np.bincount(
                    batch.digits[where], weights=dlogp[where], minlength=grad.shape[0]
                )
                grad -= per_digit[:, None] * np.exp(logps[name])
            grads[name] = grad
        with np.errstate(over="ignore", invalid="ignore"):
            outside = np.abs(ratio - 1.0) > self._eps
            diagnostics = {
                "clip_fraction": float(outside.mean()),
                "mean_ratio": float(ratio.mean()),
                "max_ratio": float(ratio.max()),
                "clamped_tokens": float(clamped.sum()),
                "nonfinite_tokens": float((~np.isfinite(objective)).sum()),
            }
        return loss, grads, diagnostics

    def loss_and_grad(
        self, samples: Sequence[TrainSample]
    ) -> tuple[float, dict[str, npt.NDArray[np.float64]]]:
        """The objective and its analytic gradient at the current params (no update)."""
        batch = _Batch(samples)
        if batch.tokens == 0:
            return 0.0, {name: np.zeros(shape) for name, shape in PARAM_SHAPES.items()}
        loss, grads, _ = self._objective(batch, self._params)
        return loss, grads

    def _adam(self, update: _Update, grads: Mapping[str, npt.NDArray[np.float64]]) -> _Update:
        """One Adam step from ``update``, as a new :class:`_Update` (nothing is changed)."""
        t = update.adam_step + 1
        b1, b2 = self._beta1, self._beta2
        params, m, v = {}, {}, {}
        with np.errstate(over="ignore", invalid="ignore"):
            for name, grad in grads.items():
                m[name] = b1 * update.m[name] + (1.0 - b1) * grad
                v[name] = b2 * update.v[name] + (1.0 - b2) * grad * grad
                m_hat = m[name] / (1.0 - b1**t)
                v_hat = v[name] / (1.0 - b2**t)
                params[name] = update.params[name] - self._lr * m_hat / (
                    np.sqrt(v_hat) + self._adam_eps
                )
        return _Update(params, m, v, t)

    def train_step(
        self, samples: Sequence[TrainSample], *, version: int | None = None
    ) -> dict[str, float]:
        """``epochs`` Adam steps on ``samples``; the new weights are ``version`` (by
        default the next one), whatever the batch.

        Metrics are measured before the first update (what the behaviour data looked like
        to the current policy). An empty batch (or one without generated tokens) changes
        no parameter and no optimizer state, but still names the new version. A sample
        this policy cannot have produced, or a version not above the current one, raises
        ``ValueError`` before anything changes.

        The update is computed aside and applied only if the loss, every gradient and the
        resulting parameters and Adam moments are finite, for every epoch. Otherwise the
        step is skipped: parameters, Adam moments and step count are untouched, the new
        version is still named (the controller keeps one per step), and the metrics say
        ``skipped: 1.0`` with ``nonfinite_tokens`` (tokens whose objective is not finite,
        e.g. a NaN captured logprob; 0 when only a sum or the optimizer overflowed). The
        ``diverged_after``-th skip in a row raises :class:`TrainingDivergedError` instead,
        changing nothing; an applied update resets the count, an empty batch leaves it.
        Captured logprobs of +-inf or any finite size are clamped (``MAX_LOG_RATIO``), not
        refused; ``clamped_tokens`` counts them.
        """
        new_version = self._version + 1 if version is None else version
        if (
            isinstance(new_version, bool)
            or not isinstance(new_version, int)
            or (new_version <= self._version)
        ):
            raise InvalidArgumentError(
                f"a train step must produce a version above {self._version}, got {version!r}",
                path="$.version",
            )
        batch = _Batch(samples)
        metrics = {
            "loss": 0.0,
            "clip_fraction": 0.0,
            "mean_ratio": 1.0,
            "max_ratio": 1.0,
            "grad_norm": 0.0,
            "tokens": float(batch.tokens),
            "samples": float(len(samples)),
            "clamped_tokens": 0.0,
            "nonfinite_tokens": 0.0,
            "skipped": 0.0,
        }
        if batch.tokens:
            update = _Update(self._params, self._m, self._v, self._adam_step)
            problem: str | None = None
            for epoch in range(self._epochs):
                loss, grads, diagnostics = self._objective(batch, update.params)
                if epoch == 0:
                    with np.errstate(over="ignore", invalid="ignore"):
                        norm = float(np.sqrt(sum(float((g * g).sum()) for g in grads.values())))
                    metrics.update(diagnostics, loss=loss, grad_norm=norm)
                problem = _nonfinite_objective(epoch, loss, grads, diagnostics)
                if problem is None:
                    update = self._adam(update, grads)
                    problem = _nonfinite_update(epoch, update)
                if problem is not None:
                    metrics["nonfinite_tokens"] = diagnostics["nonfinite_tokens"]
                    break
            if problem is None:
                self._params, self._m, self._v = update.params, update.m, update.v
                self._adam_step = update.adam_step
                self._skipped_in_a_row = 0
            else:
                if self._skipped_in_a_row + 1 >= self._diverged_after:
                    raise TrainingDivergedError(
                        skipped_in_a_row=self._skipped_in_a_row + 1,
                        weight_version=self._version,
                        reason=problem,
                    )
                self._skipped_in_a_row += 1
                metrics["skipped"] = 1.0
        metrics["skipped_in_a_row"] = float(self._skipped_in_a_row)
        self._version = new_version
        return metrics

    # -- state ----------------------------------------------------------------------------

    def state(self) -> dict[str, npt.NDArray[Any]]:
        """Everything to resume bit-for-bit, as plain arrays (``np.savez``-able, no pickle).

        Hyperparameters are not state: they come from the job config on resume.
        ``skipped_in_a_row`` is, so a resumed run goes on counting skipped steps.
        """
        out: dict[str, npt.NDArray[Any]] = {
            "version": np.array(self._version, dtype=np.int64),
            "adam_step": np.array(self._adam_step, dtype=np.int64),
            "skipped_in_a_row": np.array(self._skipped_in_a_row, dtype=np.int64),
        }
        for name in PARAM_SHAPES:
            out[f"param.{name}"] = self._params[name].copy()
            out[f"adam_m.{name}"] = self._m[name].copy()
            out[f"adam_v.{name}"] = self._v[name].copy()
        return out

    def load_state(self, state: Mapping[str, npt.NDArray[Any]]) -> None:
        """Restore :meth:`state` output exactly; refuses a bad state before changing anything.

        Raises ``ValueError`` naming the first missing, unexpected, misshaped, mistyped or
        non-finite key. A state without ``skipped_in_a_row`` (written before skipped steps
        were counted) loads with a count of 0.
        """
        state = {**_STATE_DEFAULTS, **state}
        expected: dict[str, tuple[tuple[int, ...], str]] = {
            "version": ((), "i"),
            "adam_step": ((), "i"),
            "skipped_in_a_row": ((), "i"),
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
            if kind == "i" and not 0 <= int(value) <= _INT64_MAX:
                # At most int64: what the controller state, the journal and the next
                # checkpoint's arrays hold.
                raise InvalidStateError(
                    f"trainer state key {key!r} must be in [0, {_INT64_MAX}], got {int(value)}"
                )
            if key.startswith("adam_v.") and (value < 0).any():
                raise InvalidStateError(f"trainer state key {key!r} must be >= 0")
            loaded[key] = value
        self._version = int(loaded["version"])
        self._adam_step = int(loaded["adam_step"])
        self._skipped_in_a_row = int(loaded["skipped_in_a_row"])
        for name in PARAM_SHAPES:
            self._params[name] = np.array(loaded[f"param.{name}"], dtype=np.float64)
            self._m[name] = np.array(loaded[f"adam_m.{name}"], dtype=np.float64)
            self._v[name] = np.array(loaded[f"adam_v.{name}"], dtype=np.float64)
        self._snapshot = None
