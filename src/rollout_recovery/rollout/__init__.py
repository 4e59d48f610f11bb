"""Generation backends behind one protocol, :class:`GenerationBackend`.

:class:`SimulatedAgentBackend` runs two-call agent episodes on simulated workers, samples
from a :class:`~rollout_recovery.policy.PolicySnapshot`, stages every call through the
attempt's ``CaptureWriter`` and injects the faults of :class:`FaultSettings`.

:class:`HttpGenerationBackend` runs the same episodes against OpenAI-compatible servers
(vLLM, SGLang, ``rollout-recovery serve``) token in, token out, through one of the wire
:data:`DIALECTS`; a :class:`ServerPool` tracks the servers' health and weight versions, a
:class:`WeightSync` pushes the trainer's weights to them.
"""

from ._config import FaultsConfig, GenerationConfig, HttpConfig, check_server_urls
from ._http_backend import HttpBackendSettings, HttpGenerationBackend, classify_status
from ._outcomes import AttemptFailure, FailureReason
from ._protocol import (
    AttemptRequest,
    AttemptResult,
    BackendStartup,
    BackendTelemetry,
    GenerationBackend,
)
from ._server_pool import PoolSettings, ServerHealth, ServerPool, ServerStats
from ._server_url import server_url_problem
from ._simulated import CAPTURE_FAILURE_REASON, FaultSettings, SimulatedAgentBackend
from ._weight_sync import (
    WEIGHT_SYNCS,
    NoWeightSync,
    PolicyWeightSync,
    VersionTagSync,
    WeightSync,
    WeightSyncName,
    parse_version,
)
from ._wire import (
    DIALECTS,
    CallSpec,
    DataFailure,
    Dialect,
    DialectName,
    ServerReply,
    SglangGenerate,
    VllmCompletions,
    VllmGenerate,
    read_body,
)

__all__ = [
    "CAPTURE_FAILURE_REASON",
    "DIALECTS",
    "WEIGHT_SYNCS",
    "AttemptFailure",
    "AttemptRequest",
    "AttemptResult",
    "BackendStartup",
    "BackendTelemetry",
    "CallSpec",
    "DataFailure",
    "Dialect",
    "DialectName",
    "FailureReason",
    "FaultSettings",
    "FaultsConfig",
    "GenerationBackend",
    "GenerationConfig",
    "HttpBackendSettings",
    "HttpConfig",
    "HttpGenerationBackend",
    "NoWeightSync",
    "PolicyWeightSync",
    "PoolSettings",
    "ServerHealth",
    "ServerPool",
    "ServerReply",
    "ServerStats",
    "SglangGenerate",
    "SimulatedAgentBackend",
    "VersionTagSync",
    "VllmCompletions",
    "VllmGenerate",
    "WeightSync",
    "WeightSyncName",
    "check_server_urls",
    "classify_status",
    "parse_version",
    "read_body",
    "server_url_problem",
]
