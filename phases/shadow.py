"""Which batches a shadow comparison checks: :func:`sampled`, a deterministic draw.

The draw depends on the seed and the batch number only, so every CP rank (and every replay
of a trace) samples the same batches; cpkv's runtime loop and its SGLang plugin use it.
"""

from __future__ import annotations

import hashlib

__all__ = ["sampled"]


def sampled(batch: int, rate: float, seed: int) -> bool:
    """Whether batch ``batch`` is shadowed: a deterministic draw from (seed, batch)."""
    if rate <= 0.0:
        return False
    if rate >= 1.0:
        return True
    digest = hashlib.blake2b(f"{seed}:{batch}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") < rate * 2**64
