"""The trainer seam: what the controller needs from whatever learns from canonical rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar, runtime_checkable

import numpy as np
import numpy.typing as npt

__all__ = ["FileStateTrainer", "TrainSample", "Trainer"]

# What a trainer hands to generation (``PolicySnapshot``, ``TorchWeights``...). Covariant:
# a trainer of snapshots is a trainer of objects, never of another weights type.
Weights_co = TypeVar("Weights_co", covariant=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainSample:
    """One valid canonical row, ready for the loss.

    ``token_mask`` is 1.0 on generated tokens (the only ones that train) and 0.0 on carried
    prompt tokens; ``logprobs`` are the behaviour policy's logprobs captured at generation
    (0.0 on prompt tokens); ``advantage`` is the row's GRPO advantage. Placeholders never
    reach a trainer: the controller drops them after computing advantages.

    ``token_versions`` (when the controller can vouch for them; None when generation
    serves weights the job does not control, as a server under ``weight_sync = "none"``)
    is, per position, the weight version that generated the token, -1 on prompt tokens.
    A trainer that holds a token's version recomputes the very logprob the generator
    reported, up to numerical noise: it measures the mean absolute gap (nats, each
    log-ratio bounded as in the loss) over such tokens in the step's first pass, and a gap
    above its ``logprob_tolerance`` means the logprobs are another model's. That step
    changes no parameter and no optimizer state, and its metrics say
    ``logprob_refused = 1`` (with ``logprob_gap`` and ``logprob_checked_tokens`` always).
    """

    #: ``[trainer] logprob_tolerance``'s default, in nats of mean absolute gap: about the
    #: clip range (log 1.2 = 0.18), so a step at that gap is mostly clipped before it has
    #: learned anything, and millions of times the gap honest generation shows
    #: (docs/reliability.md has the measurements).
    DEFAULT_LOGPROB_TOLERANCE: ClassVar[float] = 0.2

    token_ids: npt.NDArray[np.int32]
    token_mask: npt.NDArray[np.float32]
    logprobs: npt.NDArray[np.float32]
    advantage: float
    token_versions: npt.NDArray[np.int64] | None = None


class Trainer(Protocol[Weights_co]):
    """Learns from GRPO samples and hands its weights to generation.

    ``weight_version`` names the current weights. ``train_step`` trains one step, even on
    an empty batch, and names the weights it produces ``version``: the controller chooses
    it, above every version the run ever produced (after a restore rolled training back,
    the next version still continues above the lost ones, so one number never names two
    sets of weights). ``vocab_size`` is the trainer's vocabulary: it trains token ids in
    ``[0, vocab_size)`` only, and a generation backend that receives ids from elsewhere (a
    server) refuses others before staging them. ``weights`` returns an immutable snapshot
    a generation backend may keep while training goes on; its type is the trainer's type
    parameter, so the type checker proves a backend of the same parameter can take it
    (``GenerationBackend[W]``). ``state`` is everything needed
    to resume bit-for-bit (plain numpy arrays, saved without pickle); ``load_state``
    restores it.
    """

    @property
    def weight_version(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    def weights(self) -> Weights_co: ...

    def train_step(self, samples: Sequence[TrainSample], *, version: int) -> dict[str, float]: ...

    def state(self) -> dict[str, npt.NDArray[Any]]: ...

    def load_state(self, state: Mapping[str, npt.NDArray[Any]]) -> None: ...


@runtime_checkable
class FileStateTrainer(Protocol):
    """A trainer whose state is files (safetensors, JSON), saved as they are.

    A checkpoint saves ``state_files()`` (plain file name -> bytes) instead of
    ``state()``'s arrays when the trainer has both methods, and a restore hands them back
    to ``load_state_files``, which restores exactly or refuses changing nothing. Large
    models keep their native formats this way, with no second copy in a numpy archive.
    """

    def state_files(self) -> dict[str, bytes]: ...

    def load_state_files(self, files: Mapping[str, bytes]) -> None: ...
