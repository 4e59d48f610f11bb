"""Adapters: the recorder plugged into a peer's own loop, one public module per peer.

``rollout_recovery.adapters.trl`` (TRL's ``GRPOTrainer``) and
``rollout_recovery.adapters.verl`` (verl's agent loops). Each imports its peer, which
only that peer's environment installs, so this facade exports nothing and imports neither.
"""

__all__: list[str] = []
