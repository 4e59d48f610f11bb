"""Generation backends behind one protocol, :class:`GenerationBackend`.

One agent episode, written once (:func:`run_episode`): a task's turns (:class:`Turn`)
against a one-method :class:`ModelClient` (``generate(prompt_ids, *, call_id, sampling)
-> Completion``), every call staged through the attempt's ``CaptureWriter`` before the
episode goes on; given an earlier attempt's staged calls, it continues them.

:class:`SimulatedAgentBackend` runs the digit task's episodes on simulated workers,
samples from a :class:`~rollout_recovery.policy.PolicySnapshot` and injects the faults of
``[faults]`` through a decorator client.

:class:`HttpGenerationBackend` runs the same episodes against OpenAI-compatible servers
(vLLM, SGLang, ``rollout-recovery serve``) token in, token out, through the wire dialect
``[http] dialect`` names; a server pool tracks the servers' health and weight versions, a
:class:`WeightSync` pushes the trainer's weights to them. Both are built from their config
sections (``from_config``): the knobs are written once, in ``[generation]``, ``[faults]``,
``[http]`` and ``[task]``.
"""

from .._outcomes import FailureReason
from ._config import FaultsConfig, GenerationConfig, HttpConfig
from ._episode import Completion, Sampling, Turn, run_episode
from ._http_backend import HttpGenerationBackend
from ._protocol import (
    AttemptFailure,
    AttemptRequest,
    AttemptResult,
    BackendStartup,
    BackendTelemetry,
    GenerationBackend,
)
from ._simulated import SimulatedAgentBackend
from ._weight_sync import WeightSync

__all__ = [
    "AttemptFailure",
    "AttemptRequest",
    "AttemptResult",
    "BackendStartup",
    "BackendTelemetry",
    "Completion",
    "FailureReason",
    "FaultsConfig",
    "GenerationBackend",
    "GenerationConfig",
    "HttpConfig",
    "HttpGenerationBackend",
    "Sampling",
    "SimulatedAgentBackend",
    "Turn",
    "WeightSync",
    "run_episode",
]
