"""Deterministic token ids: a function of (the request that first wrote them, position).

A request's current tokens are always its own, so a chunk's ids follow from its rid and its
positions alone: ``token_ids(rid_key(rid), positions, vocab)``. The formula uses only
``*``, ``+`` and ``%`` on non-negative integers below ``2**52``, so numpy on the host and
torch on any device (CPU, CUDA, ``meta``) compute the same ids, and the run step expands
them on its device from one key per request.
"""

from __future__ import annotations

import hashlib
from typing import Any, TypeVar, cast

__all__ = ["TOKEN_HASH_MODULUS", "rid_key", "token_ids"]

TOKEN_HASH_MODULUS = 2**31 - 1
"""The Mersenne prime the ids are mixed modulo; keys are below it."""

_POSITION_STRIDE = 1_000_003
_MIXERS = (48_271, 69_621, 16_807)

IntArray = TypeVar("IntArray")


def rid_key(rid: str) -> int:
    """A request's token-id key: blake2b of its rid (stable across processes and runs)."""
    digest = hashlib.blake2b(rid.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % TOKEN_HASH_MODULUS


def token_ids(keys: IntArray, positions: IntArray, vocab_size: int) -> IntArray:
    """Token ids of ``positions`` written by the requests of ``keys`` (broadcast together).

    Args:
        keys: ``rid_key`` of the writing request, an int or an int64 array/tensor.
        positions: Logical positions (``>= 0`` and ``< 2**20``), same kind as ``keys``.
        vocab_size: Number of ids; results are in ``[0, vocab_size)``.

    Returns:
        The ids, the same kind and broadcast shape as the inputs.
    """
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    # NOTE: every product stays below 2**31 * 2**20: exact in int64 on every device.
    key: Any = keys
    mixed: Any = (key * _POSITION_STRIDE + positions) % TOKEN_HASH_MODULUS
    for mixer in _MIXERS:
        mixed = (mixed * mixer + 1) % TOKEN_HASH_MODULUS
    return cast(IntArray, mixed % vocab_size)
