"""Clusters on Ray: generation workers and the data plane as Ray actors (``[ray]`` extra).

:meth:`RayConfig.generation_backend` runs attempts on a pool of generation actors (the
simulated environment with the numpy policy, or a proxy to HTTP servers) and replaces the
ones that die; :meth:`RayConfig.data_plane` serves the ``DataPlane`` protocol from
SQLite-backed shard actors that workers on any node reach, fencing the writers of dead
actors. Both build from :class:`RayConfig` (the ``[ray]`` section of the config tree) and
are importable without Ray: they import it when they run, so the rest of the library
never imports it unless a job asks for ``generation.backend = "ray"``.
"""

from ._config import RayConfig

__all__ = ["RayConfig"]
