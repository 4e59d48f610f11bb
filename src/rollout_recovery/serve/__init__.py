"""``rollout-recovery serve``: an OpenAI-compatible (vLLM-compatible) server of the numpy policy.

Token in, token out: ``POST /v1/completions`` (vLLM's ``return_token_ids`` and
``return_tokens_as_token_ids``) and ``POST /inference/v1/generate`` sample from a
:class:`~rollout_recovery.policy.PolicySnapshot` with exact logprobs; ``POST /update_weights``
loads new weights, never an older version; ``POST /pause?mode=keep`` and ``POST /resume``
stop calls in flight between tokens (``--token-latency-s`` paces them) so that weights loaded
meanwhile generate the rest of them. Every generation answer carries its weight
version in an ``X-Weight-Version`` header. :class:`PolicyServer` runs one in-process (tests,
the HTTP generation backend's tests); the command runs one per process and announces it
through a ready file (:func:`read_ready_file`).
"""

from ._server import PolicyServer
from ._settings import ServeSettings

__all__ = [
    "PolicyServer",
    "ServeSettings",
]
