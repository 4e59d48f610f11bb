"""Where ``[model] source`` is on disk, building it on first use, and its digest.

``"tiny-llama"`` is built and ``"smollm2"`` converted into the cache directory once, under
a file lock (two jobs starting together build it once), and published whole (a killed
build leaves no model a later start would take as complete). A local directory is used
in place. A Hugging Face repo id (``"org/name"``, or ``"org/name@revision"``) that is no
local path is the snapshot in the Hugging Face hub cache (``huggingface_hub``'s layout,
``$HF_HUB_CACHE``, by default ``~/.cache/huggingface/hub``): taken from the cache when it
is there, downloaded into it where the hub is reachable (config, tokenizer and
safetensors files only), and otherwise refused naming the cache. Imports torch only when
a model has to be built.

The digest is the job's identity for a model (``[model] digest``): sha256 over the files
the trainer reads (``config.json``, the safetensors weights and their index), names and
sizes included, so a changed weight or config makes another job.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Final

import msgspec

from ..errors import ConfigError, InvalidOperationError, InvalidStateError
from ._extra import LLM_EXTRA_HINT, require_llm
from ._tiny_llama import TinyLlamaSpec, build_tiny_llama, is_complete
from ._weight_index import CONFIG, model_file, weight_file_names

if TYPE_CHECKING:  # the section builds with this module: its type, for the type checker
    from ._config import ModelConfig

__all__ = [
    "SMOLLM2_SOURCE",
    "TINY_LLAMA_SOURCE",
    "TINY_LLAMA_SPEC",
    "default_cache_dir",
    "hub_repo",
    "model_digest",
    "model_directory",
    "prepare_model",
    "resolve_model",
]

TINY_LLAMA_SOURCE: Final = "tiny-llama"
SMOLLM2_SOURCE: Final = "smollm2"
#: The tiny model the trainer trains: the vLLM tests' model, stored in fp32 so the
#: trainer's master weights start from exactly the built ones.
TINY_LLAMA_SPEC: Final = TinyLlamaSpec(dtype="float32")
#: SmolLM2 is stored in bf16 (269 MB); the trainer reads it as fp32.
_SMOLLM2_DIR: Final = "smollm2-135m-instruct-bf16"
_CHUNK: Final = 1 << 20


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/rollout-recovery/models``, or ``~/.cache/rollout-recovery/models``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rollout-recovery" / "models"


def _cache(model: ModelConfig) -> Path:
    return Path(model.cache_dir).expanduser() if model.cache_dir else default_cache_dir()


def _tiny_name() -> str:
    spec = json.dumps(asdict(TINY_LLAMA_SPEC), sort_keys=True).encode()
    return f"tiny-llama-{hashlib.sha256(spec).hexdigest()[:12]}"


# "org/name" or "org/name@revision": the hub's repo id grammar, loosely.
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*(@[\w./-]+)?\Z")
# What a causal LM needs of a hub snapshot (the trainer reads safetensors only).
_HUB_FILES: Final = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken"]


def hub_repo(source: str) -> tuple[str, str | None] | None:
    """``(repo_id, revision)`` when ``source`` names a Hugging Face repo rather than a
    local path (a path that exists, or one starting with ``.``, ``/`` or ``~``, is one)."""
    if source.startswith((".", "/", "~")) or not _REPO_ID.match(source):
        return None
    if Path(source).exists():
        return None
    repo, _, revision = source.partition("@")
    return repo, revision or None


def _hub_snapshot(source: str, *, download: bool) -> Path:
    """The snapshot directory of a hub repo in the local cache, downloaded first when
    ``download`` and the hub is reachable; a ``ConfigError`` naming the cache otherwise."""
    repo = hub_repo(source)
    assert repo is not None
    repo_id, revision = repo
    try:
        from huggingface_hub import constants, snapshot_download
    except ImportError:
        raise ConfigError(
            f"{source!r} is a Hugging Face repo id: reading it needs huggingface_hub ("
            f"{LLM_EXTRA_HINT})",
            path="$.model.source",
        ) from None
    cache = constants.HF_HUB_CACHE
    try:
        return Path(snapshot_download(repo_id, revision=revision, local_files_only=True))
    except Exception as error:  # not cached (LocalEntryNotFoundError), or a broken cache
        cached_error = error
    why = "HF_HUB_OFFLINE is set" if download else "it is not downloaded here"
    if download and not constants.HF_HUB_OFFLINE:
        try:
            return Path(snapshot_download(repo_id, revision=revision, allow_patterns=_HUB_FILES))
        except Exception as error:
            raise ConfigError(
                f"{source!r} is no local directory, and as a Hugging Face repo id it is not "
                f"in the cache {cache} and could not be downloaded ({type(error).__name__}: "
                f"{error}). On a machine that reaches the hub, `hf download {repo_id}` fills "
                "that cache (copy it here, or point HF_HUB_CACHE at a copy); or set [model] "
                "source to a local model directory",
                path="$.model.source",
            ) from None
    raise ConfigError(
        f"{source!r} is no local directory, and as a Hugging Face repo id it is not in the "
        f"cache {cache} ({type(cached_error).__name__}), and {why}: `hf download "
        f"{repo_id}` fills that cache where the hub is reachable (or point HF_HUB_CACHE at "
        "a copy); or set [model] source to a local model directory",
        path="$.model.source",
    )


def model_directory(model: ModelConfig) -> Path:
    """Where ``model.source`` is (or will be, once :func:`prepare_model` built it); a hub
    repo id must be in the cache already (``prepare_model`` downloads it)."""
    if model.source == TINY_LLAMA_SOURCE:
        return _cache(model) / _tiny_name()
    if model.source == SMOLLM2_SOURCE:
        return _cache(model) / _SMOLLM2_DIR
    if hub_repo(model.source) is not None:
        return _hub_snapshot(model.source, download=False)
    return Path(model.source).expanduser()


def prepare_model(model: ModelConfig) -> Path:
    """The model's directory, built or converted first if it is not there yet.

    A ``ConfigError`` at ``$.model.source`` for a directory that is not a model, or for
    SmolLM2 without its wheel (the message says what to install).
    """
    if hub_repo(model.source) is not None:
        directory = _hub_snapshot(model.source, download=True)
    else:
        directory = model_directory(model)
    if model.source not in (TINY_LLAMA_SOURCE, SMOLLM2_SOURCE):
        if not (directory / "config.json").is_file():
            raise ConfigError(
                f"{str(directory)!r} is not a model directory (no config.json); the source "
                f"is {TINY_LLAMA_SOURCE!r}, {SMOLLM2_SOURCE!r}, the path of a local "
                "Hugging Face model directory or a Hugging Face repo id ('org/name')",
                path="$.model.source",
            )
        return directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    with _build_lock(directory):
        if model.source == TINY_LLAMA_SOURCE:
            if not is_complete(directory, TINY_LLAMA_SPEC):
                build_tiny_llama(directory, TINY_LLAMA_SPEC)
        elif not (directory / "config.json").is_file():
            _convert_smollm2(directory)
    return directory


def _convert_smollm2(directory: Path) -> None:
    import torch

    from ._smollm2 import convert_smollm2

    try:
        convert_smollm2(directory, dtype=torch.bfloat16)
    except InvalidOperationError as error:
        raise ConfigError(str(error), path="$.model.source") from None


@contextlib.contextmanager
def _build_lock(directory: Path) -> Iterator[None]:
    """One builder per cached model across processes (flock on a file beside it)."""
    with open(directory.parent / f".{directory.name}.lock", "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def model_digest(directory: Path) -> str:
    """sha256 (hex) of the model's ``config.json`` and weight files, names and sizes
    included (the identity ``[model] digest`` records). Each file must be a regular file
    inside ``directory`` (``_weight_index``): a ``ConfigError`` naming it otherwise."""
    directory = Path(directory)
    digest = hashlib.sha256()
    path = directory
    try:
        for name in [CONFIG, *weight_file_names(directory)]:
            path = model_file(directory, name)
            size = path.stat().st_size
            digest.update(f"{name}\0{size}\0".encode())
            with open(path, "rb") as handle:
                while chunk := handle.read(_CHUNK):
                    digest.update(chunk)
    except InvalidStateError as error:
        raise ConfigError(
            f"{str(directory)!r} is not a model directory: {error}", path="$.model.source"
        ) from None
    except OSError as error:
        raise ConfigError(
            f"cannot read {str(path)!r}: {error.strerror or error}", path="$.model.source"
        ) from None
    return digest.hexdigest()


def resolve_model(
    model: ModelConfig, *, target_token: int, log: Callable[[str], None] = lambda _: None
) -> ModelConfig:
    """``model`` with ``digest`` taken from the model's files (built or converted
    first when missing).

    Refuses, with a ``ConfigError``: a missing ``[llm]`` extra, a source that is not a
    model, files whose digest differs from a pinned ``digest``, a ``target_token``
    outside the model's vocabulary.
    """
    require_llm()
    directory = prepare_model(model)
    digest = model_digest(directory)
    if model.digest and model.digest != digest:
        raise ConfigError(
            f"the model files in {str(directory)!r} have digest {digest}, not the "
            f"{model.digest} this job was started with: the model changed (restore its "
            "files, or start a new run in another directory)",
            path="$.model.digest",
        )
    vocab = _vocab_size(directory)
    if vocab is not None and target_token >= vocab:
        raise ConfigError(
            f"{target_token} is outside the model's vocabulary of {vocab}",
            path="$.task.target_token",
        )
    log(f"model {model.source}: {directory} (sha256 {digest[:16]}...)")
    return msgspec.structs.replace(model, digest=digest)


def _vocab_size(directory: Path) -> int | None:
    try:
        value = json.loads((directory / "config.json").read_text()).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None
