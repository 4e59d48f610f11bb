"""Generation backends behind one protocol, :class:`GenerationBackend`.

One agent episode, written once (:func:`run_episode`): a task's turns (:class:`Turn`)
against a one-method :class:`ModelClient` (``generate(prompt_ids, *, call_id, sampling)
-> Completion``), every call staged through the attempt's ``CaptureWriter`` before the
episode goes on. :class:`BackendResume` is the optional capability of continuing an
earlier attempt's staged calls.

:class:`SimulatedAgentBackend` runs the digit task's episodes on simulated workers,
samples from a :class:`~rollout_recovery.policy.PolicySnapshot` and injects the faults of
:class:`FaultSettings` through a decorator client.

:class:`HttpGenerationBackend` runs the same episodes against OpenAI-compatible servers
(vLLM, SGLang, ``rollout-recovery serve``) token in, token out, through one of the wire
:data:`DIALECTS`; a :class:`ServerPool` tracks the servers' health and weight versions, a
:class:`WeightSync` pushes the trainer's weights to them.
"""

from ._config import (
    FaultsConfig,
    GenerationConfig,
    HttpConfig,
    check_server_urls,
    check_weight_update_mode,
)
from ._episode import Completion, Sampling, Turn, run_episode
from ._faults import FaultSettings
from ._http_backend import HttpBackendSettings, HttpGenerationBackend
from ._outcomes import AttemptFailure, FailureReason
from ._protocol import (
    AttemptRequest,
    AttemptResult,
    BackendResume,
    BackendStartup,
    BackendTelemetry,
    GenerationBackend,
)
from ._server_pool import PoolSettings
from ._simulated import SimulatedAgentBackend
from ._weight_sync import WEIGHT_SYNCS, WeightSync, WeightSyncName, parse_version
from ._wire import DIALECTS, DataFailure, read_body

__all__ = [
    "DIALECTS",
    "WEIGHT_SYNCS",
    "AttemptFailure",
    "AttemptRequest",
    "AttemptResult",
    "BackendResume",
    "BackendStartup",
    "BackendTelemetry",
    "Completion",
    "DataFailure",
    "FailureReason",
    "FaultSettings",
    "FaultsConfig",
    "GenerationBackend",
    "GenerationConfig",
    "HttpBackendSettings",
    "HttpConfig",
    "HttpGenerationBackend",
    "PoolSettings",
    "Sampling",
    "SimulatedAgentBackend",
    "Turn",
    "WeightSync",
    "WeightSyncName",
    "check_server_urls",
    "check_weight_update_mode",
    "parse_version",
    "read_body",
    "run_episode",
]
