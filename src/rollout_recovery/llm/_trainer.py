"""GRPO on a Hugging Face causal LM with torch: the clipped importance ratio, AdamW, fp32.

Per generated token t of a sample (``token_mask[t] == 1``), the new policy's logprob is
``log_softmax(logits[t - 1] / temperature)[token_ids[t]]`` (the distribution generation
sampled from, so ``temperature`` must be the sampler's), and with the captured behaviour
logprob ``b_t``::

    ratio_t = exp(clamp(logp_t - b_t, -max_log_ratio, max_log_ratio))
    loss    = -sum_t min(ratio_t * A, clip(ratio_t, 1 - eps, 1 + eps) * A) / n_tokens

summed over every generated token of the batch (the numpy trainer's token mean). The batch
is cut into micro-batches of ``micro_batch_size`` samples whose gradients accumulate,
each scaled by the whole batch's token count, so the update equals the full batch's.
Parameters and AdamW's moments are fp32 (master weights).

Bounding the log-ratio keeps one stale or corrupt captured logprob from producing an
infinite ratio; a token whose log-ratio hits the bound gets no gradient. A step whose loss
or gradient norm is not finite changes no parameter and no optimizer state; the version
still advances (versions and steps stay in lockstep) and the metrics say ``skipped = 1``.
A step whose gradient is exactly zero (no advantage, or every token clipped) changes
nothing either (``no_signal = 1``): AdamW would otherwise keep moving every parameter by
its momentum, with nothing to learn from.

State for checkpoints (:meth:`state_files`): ``model.safetensors`` (parameters),
``optimizer.safetensors`` (AdamW moments and step counts per parameter) and
``state.json`` (version, counters, the trainer's own torch, numpy and python RNG
states); never pickle. :meth:`state` / :meth:`load_state` carry the same as numpy arrays.
Loading either back makes the trainer continue bit for bit as the saved one would have.
"""

from __future__ import annotations

import base64
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt
import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors
from transformers import PreTrainedModel

from ..errors import InvalidArgumentError, InvalidStateError
from ..policy import TrainSample
from ._model_files import load_causal_lm, vocab_size_of
from ._skeleton import ModelSkeleton
from ._weights import TorchWeights

__all__ = [
    "DEFAULT_MAX_LOG_RATIO",
    "MODEL_STATE_FILE",
    "OPTIMIZER_STATE_FILE",
    "TRAINER_STATE_FILE",
    "TorchGRPOTrainer",
]

MODEL_STATE_FILE = "model.safetensors"
OPTIMIZER_STATE_FILE = "optimizer.safetensors"
TRAINER_STATE_FILE = "state.json"
#: exp(20) is about 5e8: far outside any clip range, finite in fp32.
DEFAULT_MAX_LOG_RATIO = 20.0

_STATE_FORMAT = 1
_INT64_MAX = 2**63 - 1
_MOMENTS = ("exp_avg", "exp_avg_sq", "step")
# state() keys: the numpy trainer's names where they mean the same thing.
_ARRAY_PREFIX = {"param": "param.", "exp_avg": "adam_m.", "exp_avg_sq": "adam_v."}
_ARRAY_STEP_PREFIX = "adam_step."
_ARRAY_META = "trainer_json"


class _TrainerMeta(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """``state.json``: everything but tensors."""

    format: int
    version: int
    updates: int
    skipped: int
    torch_rng: str  # base64 of torch's CPU generator state
    numpy_rng: dict[str, Any]  # numpy.random.PCG64 bit_generator.state
    python_rng: list[Any]  # random.Random.getstate(), tuples as lists


@dataclass(frozen=True, slots=True)
class _Batch:
    """The samples as padded tensors, cut into micro-batches."""

    micro: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]
    tokens: int
    samples: int


class TorchGRPOTrainer:
    """Implements :class:`~rollout_recovery.policy.Trainer` for a causal LM on CPU.

    ``model_dir`` holds ``config.json`` and safetensors weights (e.g. built by
    :func:`build_tiny_llama`); they are loaded as fp32. ``seed`` seeds the trainer's own
    RNGs (dropout, if the model has any, draws from them, never from the process's).
    """

    def __init__(
        self,
        model_dir: Path,
        *,
        seed: int,
        learning_rate: float = 1e-3,
        clip_epsilon: float = 0.2,
        temperature: float = 1.0,
        micro_batch_size: int | None = None,
        epochs: int = 1,
        weight_decay: float = 0.0,
        adam_beta1: float = 0.9,
        adam_beta2: float = 0.999,
        adam_eps: float = 1e-8,
        max_grad_norm: float | None = 1.0,
        max_log_ratio: float = DEFAULT_MAX_LOG_RATIO,
    ) -> None:
        _check_int("seed", seed, minimum=0)
        _check_positive("learning_rate", learning_rate)
        if not 0 < clip_epsilon < 1:
            raise InvalidArgumentError(f"clip_epsilon must be in (0, 1), got {clip_epsilon!r}")
        _check_positive("temperature", temperature)
        if micro_batch_size is not None:
            _check_int("micro_batch_size", micro_batch_size, minimum=1)
        _check_int("epochs", epochs, minimum=1)
        if not (math.isfinite(weight_decay) and weight_decay >= 0):
            raise InvalidArgumentError(f"weight_decay must be >= 0, got {weight_decay!r}")
        if not (0 <= adam_beta1 < 1 and 0 <= adam_beta2 < 1 and adam_eps > 0):
            raise InvalidArgumentError("adam betas must be in [0, 1) and adam_eps > 0")
        if max_grad_norm is not None:
            _check_positive("max_grad_norm", max_grad_norm)
        _check_positive("max_log_ratio", max_log_ratio)
        self._eps = float(clip_epsilon)
        self._temperature = float(temperature)
        self._micro = micro_batch_size
        self._epochs = epochs
        self._max_grad_norm = max_grad_norm
        self._max_log_ratio = float(max_log_ratio)
        self._model: PreTrainedModel = load_causal_lm(Path(model_dir), dtype=torch.float32)
        self._model.train()
        self._params: dict[str, torch.nn.Parameter] = dict(self._model.named_parameters())
        self._skeleton = ModelSkeleton.of(self._model)
        self._vocab = vocab_size_of(self._model)
        self._optimizer = torch.optim.AdamW(
            list(self._params.values()),
            lr=float(learning_rate),
            betas=(float(adam_beta1), float(adam_beta2)),
            eps=float(adam_eps),
            weight_decay=float(weight_decay),
            # One implementation on every run: foreach and the loop differ in the last bit.
            foreach=False,
        )
        generator = torch.Generator().manual_seed(seed)
        self._torch_rng: torch.Tensor = generator.get_state()
        self._numpy_rng = np.random.Generator(np.random.PCG64(seed))
        self._python_rng = random.Random(seed)
        self._version = 0
        self._updates = 0
        self._skipped = 0
        self._snapshot: TorchWeights | None = None

    # -- what the controller and generation see --------------------------------------------

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def vocab_size(self) -> int:
        """The model's vocabulary (its embedding rows): token ids must be below it."""
        return self._vocab

    @property
    def skeleton(self) -> ModelSkeleton:
        """Config and buffers, so a backend builds the same model around :meth:`weights`."""
        return self._skeleton

    @property
    def temperature(self) -> float:
        return self._temperature

    @property
    def numpy_rng(self) -> np.random.Generator:
        """The trainer's numpy generator (saved with its state) for stochastic extensions."""
        return self._numpy_rng

    @property
    def python_rng(self) -> random.Random:
        """The trainer's python generator (saved with its state)."""
        return self._python_rng

    def weights(self) -> TorchWeights:
        """The current parameters; one snapshot per version, shared by every caller."""
        if self._snapshot is None or self._snapshot.version != self._version:
            self._snapshot = TorchWeights.capture(self._version, self._params.items())
        return self._snapshot

    def named_parameters(self) -> dict[str, torch.Tensor]:
        """Copies of the live fp32 parameters (for tests and diagnostics)."""
        return {name: p.detach().clone() for name, p in self._params.items()}

    # -- the step ---------------------------------------------------------------------------

    def _batch(self, samples: Sequence[TrainSample]) -> _Batch:
        rows: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.float32], npt.NDArray[Any], float]]
        rows = []
        tokens = 0
        for index, sample in enumerate(samples):
            ids = np.asarray(sample.token_ids)
            mask = np.asarray(sample.token_mask, dtype=np.float32)
            behaviour = np.asarray(sample.logprobs, dtype=np.float32)
            where = f"sample {index}"
            if ids.ndim != 1 or ids.dtype.kind not in "iu":
                raise InvalidArgumentError(f"{where}: token_ids must be a 1-d integer array")
            if mask.shape != ids.shape or behaviour.shape != ids.shape:
                raise InvalidArgumentError(
                    f"{where}: token_ids, token_mask and logprobs differ in length "
                    f"({ids.shape[0]}, {mask.shape[0] if mask.ndim else 0}, "
                    f"{behaviour.shape[0] if behaviour.ndim else 0})"
                )
            if not math.isfinite(sample.advantage):
                raise InvalidArgumentError(f"{where} has a non-finite advantage")
            bad = np.flatnonzero((ids < 0) | (ids >= self._vocab))
            if bad.size:
                position = int(bad[0])
                raise InvalidArgumentError(
                    f"{where}: token {int(ids[position])} at position {position} is outside "
                    f"the model's vocabulary of {self._vocab}"
                )
            if not np.isin(mask, (0.0, 1.0)).all():
                raise InvalidArgumentError(f"{where}: token_mask must hold only 0.0 and 1.0")
            if ids.shape[0] and mask[0] != 0.0:
                raise InvalidArgumentError(
                    f"{where}: position 0 is marked generated; a generated token needs a prefix"
                )
            if np.isnan(behaviour[mask == 1.0]).any():
                raise InvalidArgumentError(f"{where}: a generated token's logprob is NaN")
            tokens += int(mask.sum())
            rows.append((ids.astype(np.int64), mask, behaviour, float(sample.advantage)))
        size = self._micro or max(1, len(rows))
        micro = [_pad(rows[start : start + size]) for start in range(0, len(rows), size)]
        return _Batch(micro=micro, tokens=tokens, samples=len(rows))

    def _token_logprobs(self, ids: torch.Tensor) -> torch.Tensor:
        """logp of ids[:, 1:] under the current policy, shape (batch, length - 1)."""
        logits = self._model(input_ids=ids, use_cache=False).logits[:, :-1].float()
        logps = torch.log_softmax(logits / self._temperature, dim=-1)
        return torch.gather(logps, 2, ids[:, 1:, None]).squeeze(2)

    def _epoch(self, batch: _Batch) -> dict[str, float]:
        """Accumulate the whole batch's gradient; returns the loss and ratio diagnostics."""
        loss_total = 0.0
        outside = bounded = 0.0
        ratio_sum, ratio_max = 0.0, 0.0
        for ids, mask, behaviour, advantages in batch.micro:
            new = self._token_logprobs(ids)
            target_mask = mask[:, 1:]
            log_ratio = torch.clamp(
                new - behaviour[:, 1:], -self._max_log_ratio, self._max_log_ratio
            )
            ratio = torch.exp(log_ratio)
            unclipped = ratio * advantages[:, None]
            clipped = torch.clamp(ratio, 1.0 - self._eps, 1.0 + self._eps) * advantages[:, None]
            surrogate = torch.minimum(unclipped, clipped)
            loss = -(surrogate * target_mask).sum() / batch.tokens
            torch.autograd.backward(loss)
            with torch.no_grad():
                on = target_mask > 0
                loss_total += float(loss)
                chosen = ratio[on]
                outside += float((torch.abs(chosen - 1.0) > self._eps).sum())
                bounded += float((log_ratio[on].abs() >= self._max_log_ratio).sum())
                ratio_sum += float(chosen.sum())
                if chosen.numel():
                    ratio_max = max(ratio_max, float(chosen.max()))
        return {
            "loss": loss_total,
            "clip_fraction": outside / batch.tokens,
            "bounded_fraction": bounded / batch.tokens,
            "mean_ratio": ratio_sum / batch.tokens,
            "max_ratio": ratio_max,
        }

    def train_step(
        self, samples: Sequence[TrainSample], *, version: int | None = None
    ) -> dict[str, float]:
        """``epochs`` AdamW steps on ``samples``; the new weights are ``version`` (by
        default the next one), whatever the batch. A version not above the current one
        raises ``ValueError`` before anything changes: the controller names versions so
        that none is reused after a restore rolled training back.

        Metrics are from the first epoch (what the behaviour data looked like to the
        current policy). An empty batch (or one without generated tokens) changes no
        parameter, optimizer or RNG state. A sample this model cannot score (a token
        outside its vocabulary, mismatched lengths, a non-finite advantage) raises
        ``ValueError`` before anything changes.
        """
        new_version = self._version + 1 if version is None else version
        if isinstance(new_version, bool) or not isinstance(new_version, int):
            raise InvalidArgumentError(
                f"version must be an integer, got {version!r}", path="$.version"
            )
        if new_version <= self._version:
            raise InvalidArgumentError(
                f"a train step must produce a version above {self._version}, got {version}",
                path="$.version",
            )
        batch = self._batch(samples)
        metrics = {
            "loss": 0.0,
            "clip_fraction": 0.0,
            "bounded_fraction": 0.0,
            "mean_ratio": 1.0,
            "max_ratio": 1.0,
            "grad_norm": 0.0,
            "tokens": float(batch.tokens),
            "samples": float(batch.samples),
            "skipped": 0.0,
            "no_signal": 0.0,
        }
        if batch.tokens:
            with torch.random.fork_rng(devices=[]):
                torch.set_rng_state(self._torch_rng)
                for epoch in range(self._epochs):
                    diagnostics = self._epoch(batch)
                    norm = self._grad_norm()
                    if epoch == 0:
                        metrics.update(diagnostics, grad_norm=norm)
                    if not (math.isfinite(diagnostics["loss"]) and math.isfinite(norm)):
                        self._optimizer.zero_grad(set_to_none=True)
                        metrics["skipped"] = 1.0
                        self._skipped += 1
                        break
                    if norm == 0.0:
                        # No signal (every advantage zero, or every token clipped): an
                        # AdamW step would still move each parameter by its momentum, and
                        # that drift collapsed the tiny model onto tokens it was moving
                        # towards when the last reward came (1 seed in 8 stalled at 0).
                        metrics["no_signal"] = 1.0
                        break
                    self._optimizer.step()
                    self._optimizer.zero_grad(set_to_none=True)
                    self._updates += 1
                self._torch_rng = torch.get_rng_state()
        self._version = new_version
        return metrics

    def _grad_norm(self) -> float:
        """The gradient's total norm (before clipping); clips to ``max_grad_norm``."""
        grads = [p for p in self._params.values() if p.grad is not None]
        if not grads:
            return 0.0
        limit = self._max_grad_norm if self._max_grad_norm is not None else math.inf
        norm = torch.nn.utils.clip_grad_norm_(grads, limit, foreach=False)
        return float(norm)

    # -- state ------------------------------------------------------------------------------

    def _optimizer_tensors(self) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for name, param in self._params.items():
            state = self._optimizer.state.get(param)
            if not state:
                continue  # never updated (AdamW makes its state at a parameter's first step)
            for key in _MOMENTS:
                out[f"{key}.{name}"] = state[key].detach().clone()
        return out

    def _meta(self) -> _TrainerMeta:
        return _TrainerMeta(
            format=_STATE_FORMAT,
            version=self._version,
            updates=self._updates,
            skipped=self._skipped,
            torch_rng=base64.b64encode(self._torch_rng.numpy().tobytes()).decode("ascii"),
            numpy_rng=dict(self._numpy_rng.bit_generator.state),
            python_rng=_plain(self._python_rng.getstate()),
        )

    def state_files(self) -> dict[str, bytes]:
        """Everything to resume bit for bit, as named files (safetensors and JSON).

        Hyperparameters are not state: they come from the job's config on resume.
        """
        params = {name: p.detach().clone() for name, p in self._params.items()}
        return {
            MODEL_STATE_FILE: bytes(save_safetensors(params)),
            OPTIMIZER_STATE_FILE: bytes(save_safetensors(self._optimizer_tensors())),
            TRAINER_STATE_FILE: msgspec.json.encode(self._meta()),
        }

    def load_state_files(self, files: Mapping[str, bytes]) -> None:
        """Restore :meth:`state_files` output exactly; refuses a bad state changing nothing."""
        expected = {MODEL_STATE_FILE, OPTIMIZER_STATE_FILE, TRAINER_STATE_FILE}
        if set(files) != expected:
            raise InvalidStateError(
                f"trainer state files must be {sorted(expected)}, got {sorted(files)}"
            )
        tensors: dict[str, dict[str, torch.Tensor]] = {}
        for name in (MODEL_STATE_FILE, OPTIMIZER_STATE_FILE):
            try:
                tensors[name] = dict(load_safetensors(bytes(files[name])))
            except SafetensorError as error:
                raise InvalidStateError(f"unreadable {name}: {error}", file=name) from None
        meta = _decode_meta(bytes(files[TRAINER_STATE_FILE]), where=TRAINER_STATE_FILE)
        self._restore(tensors[MODEL_STATE_FILE], tensors[OPTIMIZER_STATE_FILE], meta)

    def state(self) -> dict[str, npt.NDArray[Any]]:
        """The same as :meth:`state_files`, as plain numpy arrays (``np.savez``-able).

        ``param.<name>``, ``adam_m.<name>``, ``adam_v.<name>``, ``adam_step.<name>``
        (float32), ``version`` (int64) and ``trainer_json`` (the JSON file's bytes as uint8).
        """
        out: dict[str, npt.NDArray[Any]] = {
            "version": np.array(self._version, dtype=np.int64),
            _ARRAY_META: np.frombuffer(msgspec.json.encode(self._meta()), dtype=np.uint8).copy(),
        }
        for name, p in self._params.items():
            out[f"param.{name}"] = p.detach().numpy().copy()
        for key, tensor in self._optimizer_tensors().items():
            moment, _, name = key.partition(".")
            prefix = _ARRAY_PREFIX.get(moment, _ARRAY_STEP_PREFIX)
            out[f"{prefix}{name}"] = tensor.numpy().copy()
        return out

    def load_state(self, state: Mapping[str, npt.NDArray[Any]]) -> None:
        """Restore :meth:`state` output exactly; refuses a bad state changing nothing."""
        params: dict[str, torch.Tensor] = {}
        optimizer: dict[str, torch.Tensor] = {}
        to_moment = {prefix: moment for moment, prefix in _ARRAY_PREFIX.items()}
        to_moment[_ARRAY_STEP_PREFIX] = "step"
        for key, value in state.items():
            if key in ("version", _ARRAY_META):
                continue
            prefix, _, name = key.partition(".")
            moment = to_moment.get(prefix + ".")
            if moment is None or not isinstance(value, np.ndarray):
                raise InvalidStateError(f"trainer state has unexpected key {key!r}")
            tensor = torch.from_numpy(np.array(value, copy=True))
            if moment == "param":
                params[name] = tensor
            else:
                optimizer[f"{moment}.{name}"] = tensor
        raw = state.get(_ARRAY_META)
        if not isinstance(raw, np.ndarray) or raw.dtype != np.uint8 or raw.ndim != 1:
            raise InvalidStateError(f"trainer state needs {_ARRAY_META!r} as a uint8 array")
        meta = _decode_meta(raw.tobytes(), where=_ARRAY_META)
        version = state.get("version")
        if (
            not isinstance(version, np.ndarray)
            or version.shape != ()
            or int(version) != meta.version
        ):
            raise InvalidStateError(
                f"trainer state 'version' must be a scalar equal to {meta.version}"
            )
        self._restore(params, optimizer, meta)

    def _restore(
        self,
        params: Mapping[str, torch.Tensor],
        optimizer: Mapping[str, torch.Tensor],
        meta: _TrainerMeta,
    ) -> None:
        """Validate everything, then apply it (nothing changes on a refusal)."""
        _check_tensors("parameter", params, {n: p.shape for n, p in self._params.items()})
        moments: dict[str, dict[str, torch.Tensor]] = {}
        for key, tensor in optimizer.items():
            moment, _, name = key.partition(".")
            if moment not in _MOMENTS or name not in self._params:
                raise InvalidStateError(f"optimizer state has unexpected tensor {key!r}")
            moments.setdefault(name, {})[moment] = tensor
        for name, found in moments.items():
            shape = self._params[name].shape
            _check_tensors(
                f"optimizer state of {name}",
                found,
                {"exp_avg": shape, "exp_avg_sq": shape, "step": torch.Size([])},
            )
            if (found["exp_avg_sq"] < 0).any():
                raise InvalidStateError(f"optimizer state exp_avg_sq.{name} must be >= 0")
            step = float(found["step"])
            if step < 1 or step != int(step):
                raise InvalidStateError(f"optimizer state step.{name} must be a positive count")
        torch_rng = _decode_torch_rng(meta.torch_rng, like=self._torch_rng)
        numpy_rng = np.random.Generator(np.random.PCG64())
        python_rng = random.Random()
        try:
            numpy_rng.bit_generator.state = meta.numpy_rng
            python_rng.setstate(_tuples(meta.python_rng))
        except (ValueError, TypeError, KeyError, OverflowError) as error:
            # OverflowError: a word past what the generator holds (2**70 in a 32-bit word).
            raise InvalidStateError(f"trainer state has a bad RNG state: {error}") from None
        # Everything checked: apply.
        with torch.no_grad():
            for name, param in self._params.items():
                param.copy_(params[name])
        self._optimizer.state.clear()
        for name, found in moments.items():
            self._optimizer.state[self._params[name]] = {
                key: found[key].clone() for key in _MOMENTS
            }
        self._optimizer.zero_grad(set_to_none=True)
        self._torch_rng = torch_rng
        self._numpy_rng = numpy_rng
        self._python_rng = python_rng
        self._version = meta.version
        self._updates = meta.updates
        self._skipped = meta.skipped
        self._snapshot = None


def _pad(
    rows: Sequence[tuple[npt.NDArray[np.int64], npt.NDArray[np.float32], npt.NDArray[Any], float]],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (ids, mask, behaviour logprobs, advantages). Causal attention never
    lets a real token see the padding after it, so no attention mask is needed; padded
    positions have mask 0 and contribute nothing."""
    length = max(ids.shape[0] for ids, *_ in rows)
    ids = np.zeros((len(rows), length), dtype=np.int64)
    mask = np.zeros((len(rows), length), dtype=np.float32)
    behaviour = np.zeros((len(rows), length), dtype=np.float32)
    for i, (row_ids, row_mask, row_behaviour, _) in enumerate(rows):
        n = row_ids.shape[0]
        ids[i, :n] = row_ids
        mask[i, :n] = row_mask
        # -inf captured logprobs (a token the sampler thought impossible) stay -inf: the
        # bound on the log-ratio handles them.
        behaviour[i, :n] = np.where(row_mask == 1.0, row_behaviour, 0.0)
    advantages = np.array([advantage for *_, advantage in rows], dtype=np.float32)
    return (
        torch.from_numpy(ids),
        torch.from_numpy(mask),
        torch.from_numpy(behaviour),
        torch.from_numpy(advantages),
    )


def _check_int(name: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidArgumentError(f"{name} must be an int >= {minimum}, got {value!r}")


def _check_positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgumentError(f"{name} must be a number, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise InvalidArgumentError(f"{name} must be finite and > 0, got {value!r}")


def _check_tensors(
    what: str, found: Mapping[str, torch.Tensor], shapes: Mapping[str, torch.Size]
) -> None:
    if set(found) != set(shapes):
        missing, extra = sorted(set(shapes) - set(found)), sorted(set(found) - set(shapes))
        raise InvalidStateError(f"{what}: missing {missing[:5]}, unexpected {extra[:5]}")
    for name, shape in shapes.items():
        tensor = found[name]
        if tensor.dtype != torch.float32 or tensor.shape != shape:
            raise InvalidStateError(
                f"{what}: {name} must be float32 of shape {tuple(shape)}, "
                f"got {tensor.dtype} {tuple(tensor.shape)}"
            )
        if not torch.isfinite(tensor).all():
            raise InvalidStateError(f"{what}: {name} must be finite")


def _decode_meta(data: bytes, *, where: str) -> _TrainerMeta:
    try:
        meta = msgspec.json.decode(data, type=_TrainerMeta)
    except msgspec.DecodeError as error:
        raise InvalidStateError(f"unreadable {where}: {error}", file=where) from None
    if meta.format != _STATE_FORMAT:
        raise InvalidStateError(f"{where}: unknown format {meta.format}", file=where)
    for name in ("version", "updates", "skipped"):
        # At most int64: what a checkpoint's controller state and the journal hold.
        if not 0 <= getattr(meta, name) <= _INT64_MAX:
            raise InvalidStateError(
                f"{where}: {name} must be in [0, {_INT64_MAX}], got {getattr(meta, name)}",
                file=where,
            )
    return meta


def _decode_torch_rng(text: str, *, like: torch.Tensor) -> torch.Tensor:
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError as error:
        raise InvalidStateError(f"trainer state has a bad torch RNG state: {error}") from None
    if len(raw) != like.numel():
        raise InvalidStateError(
            f"trainer state's torch RNG state is {len(raw)} bytes, expected {like.numel()}"
        )
    state = torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone()
    try:  # torch checks the state's own consistency only when it is installed
        torch.Generator().set_state(state)
    except RuntimeError as error:
        raise InvalidStateError(f"trainer state has a bad torch RNG state: {error}") from None
    return state


def _plain(value: Any) -> Any:
    """Tuples to lists, recursively (JSON has no tuples)."""
    if isinstance(value, tuple | list):
        return [_plain(item) for item in value]
    return value


def _tuples(value: Any) -> Any:
    """Lists back to tuples, recursively (what random.setstate expects)."""
    if isinstance(value, list):
        return tuple(_tuples(item) for item in value)
    return value
