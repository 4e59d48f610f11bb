"""Fixtures of the ``rollout-recovery serve`` tests: an in-process server on a free port.

``server`` runs a :class:`PolicyServer` in a thread for one test and shuts it down after;
``client`` is an ``httpx.Client`` on it.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from rollout_recovery.serve import PolicyServer, ServeSettings


@pytest.fixture
def server() -> Iterator[PolicyServer]:
    with PolicyServer(ServeSettings(port=0, seed=3)) as running:
        yield running


@pytest.fixture
def client(server: PolicyServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30.0) as http:
        yield http
