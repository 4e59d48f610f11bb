"""Generation backends behind one protocol, :class:`GenerationBackend`.

One agent episode, written once (:func:`run_episode`): a task's turns (:class:`Turn`)
against a one-method :class:`ModelClient` (``generate(prompt_ids, *, call_id, sampling)
-> Completion``), every call staged through the attempt's ``CaptureWriter`` before the
episode goes on; given an earlier attempt's staged calls, it continues them.

A task (:class:`EpisodeTask`: the digit task, :class:`DigitTask`, or the LLM job's "emit
token X") builds the episode of a prompt. :class:`SimulatedAgentBackend` runs a task's
episodes on simulated workers, samples from a
:class:`~rollout_recovery.policy.PolicySnapshot` and injects the faults of ``[faults]``
through a decorator client. :class:`HttpGenerationBackend` runs them against
OpenAI-compatible servers (vLLM, SGLang, ``rollout-recovery serve``) token in, token out,
through the wire dialect ``[http] dialect`` names; a server pool tracks the servers'
health and weight versions, a weight sync pushes the trainer's weights to them. Each
takes its own config sections (``[generation]``, ``[faults]``, ``[http]``): the knobs are
written once, there, and validated once, when the config is read.
"""

from .._outcomes import FailureReason
from ._config import FaultsConfig, GenerationConfig, HttpConfig
from ._digit_task import DigitTask
from ._episode import Completion, EpisodeTask, Sampling, Turn, run_episode
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

__all__ = [
    "AttemptFailure",
    "AttemptRequest",
    "AttemptResult",
    "BackendStartup",
    "BackendTelemetry",
    "Completion",
    "DigitTask",
    "EpisodeTask",
    "FailureReason",
    "FaultsConfig",
    "GenerationBackend",
    "GenerationConfig",
    "HttpConfig",
    "HttpGenerationBackend",
    "Sampling",
    "SimulatedAgentBackend",
    "Turn",
    "run_episode",
]
