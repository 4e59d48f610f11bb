"""Generation backends behind one protocol, :class:`GenerationBackend`.

:class:`SimulatedAgentBackend` runs two-call agent episodes on simulated workers, samples
from a :class:`~rollout_recovery.policy.PolicySnapshot`, stages every call through the
attempt's ``CaptureWriter`` and injects the faults of :class:`FaultSettings`.
"""

from ._protocol import AttemptRequest, AttemptResult, GenerationBackend
from ._simulated import CAPTURE_FAILURE_REASON, FaultSettings, SimulatedAgentBackend

__all__ = [
    "CAPTURE_FAILURE_REASON",
    "AttemptRequest",
    "AttemptResult",
    "FaultSettings",
    "GenerationBackend",
    "SimulatedAgentBackend",
]
