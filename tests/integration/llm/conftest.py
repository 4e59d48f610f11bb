"""The real-vLLM tests that need the trainer's side too (torch, transformers, safetensors:
the ``[llm]`` extra, which ``.ci/vllm-integration`` installs); without it they skip."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")
