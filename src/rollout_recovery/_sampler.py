"""The dataloader's order: a seeded permutation of the dataset per epoch, O(1) per prompt.

Position ``p`` of the run is prompt ``permute(p mod size)`` of epoch ``p // size``. The
permutation is a keyed bijection on ``[0, size)`` evaluated for one index at a time (a
Feistel network over the next even power of two, cycle-walked back into range), so taking
a prompt costs the same whether the dataset holds ten prompts or ten billion, and nothing
proportional to the dataset is ever held in memory. A different seed or epoch is a
different key, hence a different order.

A bottom module: the controller takes prompts in this order, and the auditor checks a
dataset task's journal against it (``history/_dataset_check.py``).
"""

from __future__ import annotations

import functools
import hashlib

from .errors import InvalidArgumentError

__all__ = ["dataset_position_to_idx"]

_MASK64 = (1 << 64) - 1
_ROUNDS = 6


def _mix(value: int) -> int:
    """SplitMix64's finalizer: a cheap 64-bit avalanche."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


@functools.lru_cache(maxsize=16)
def _round_keys(seed: int, epoch: int) -> tuple[int, ...]:
    digest = hashlib.blake2b(f"{seed}/{epoch}".encode(), digest_size=8 * _ROUNDS).digest()
    return tuple(int.from_bytes(digest[8 * i : 8 * i + 8], "little") for i in range(_ROUNDS))


def _feistel(value: int, half_bits: int, keys: tuple[int, ...]) -> int:
    half_mask = (1 << half_bits) - 1
    left, right = value >> half_bits, value & half_mask
    for key in keys:
        left, right = right, left ^ (_mix(right ^ key) & half_mask)
    return (left << half_bits) | right


def dataset_position_to_idx(position: int, *, size: int, seed: int) -> int:
    """The dataset index the dataloader yields at ``position`` (0-based, over epochs)."""
    if size < 1:
        raise InvalidArgumentError(f"the dataset is empty (size {size})", path="$.size")
    if position < 0:
        raise InvalidArgumentError(f"position must be >= 0, got {position}", path="$.position")
    epoch, offset = divmod(position, size)
    if size == 1:
        return 0
    half_bits = max(1, ((size - 1).bit_length() + 1) // 2)
    keys = _round_keys(seed, epoch)
    # Cycle-walking: the network permutes [0, 4**half_bits), which is under 4 * size, so
    # on average fewer than 4 steps land back inside [0, size).
    value = _feistel(offset, half_bits, keys)
    while value >= size:
        value = _feistel(value, half_bits, keys)
    return value
