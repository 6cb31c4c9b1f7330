"""The copy ceiling of ``cpkv bench --rows``: contiguous copies of any byte count on the op's
device, from memory, not from a cache.

``CopyCeiling.copy(n)`` copies ``n`` bytes between two contiguous buffers in pieces of at most
64 MiB: past the caches, the rate no longer depends on the piece size. A copy smaller than
the caches would run from them, while the op reads a pool far larger than they are; so
each copy takes the next span of the buffers, memory the copies just before did not touch.

That holds only while the buffers are larger than the last-level cache: each buffer is
``max(64 MiB, last-level cache)`` (``copy_buffer_bytes``). A 64 MiB pair was past the 32 MiB
L3 of the VMs the bench first ran on, and at times inside the 480 MiB L3 of a later one
(shared with the host's other guests): the ceiling's copy of 170-652 MiB ran at 11.2-11.6
GB/s from the cache against 7.3-7.4 GB/s with buffers of 480 MiB and more (the same rate at
512, 768 and 1,024 MiB), and the large ops read about two thirds of their ratios. An hour
later the pair ran at the larger buffers' rate: the figure had hung on the neighbours.

- **The CPU's last-level cache** is the largest data or unified cache of the highest level
  that a CPU this process may run on reports in sysfs
  (``/sys/devices/system/cpu/cpuN/cache/index*``). On a CPU whose L3 is cut into slices
  (AMD's CCDs) that is the slice one thread sees, as the copy runs on one thread.
- **On CUDA**, the device's L2 (``L2_cache_size``).
- Where neither is known (no sysfs), 0: the buffers stay at 64 MiB.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

__all__ = [
    "CEILING_PIECE_BYTES",
    "CPU_CACHES",
    "CopyCeiling",
    "copy_buffer_bytes",
    "cpu_last_level_cache_bytes",
    "last_level_cache_bytes",
]

CEILING_PIECE_BYTES = 64 << 20
"""Largest single copy of the ceiling, and the least size of each of its two buffers."""
CPU_CACHES = Path("/sys/devices/system/cpu")
"""Where Linux describes each CPU's caches (``cpuN/cache/indexM/{level,type,size}``)."""
_SIZE_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _cache_size(text: str) -> int:
    """Bytes of a sysfs cache ``size`` (``48K``, ``491520K``, ``32M`` or bytes)."""
    text = text.strip()
    unit = _SIZE_UNITS.get(text[-1:].upper())
    return int(text[:-1]) * unit if unit else int(text)


def cpu_last_level_cache_bytes(cpu: int, root: Path = CPU_CACHES) -> int:
    """Bytes of the largest data or unified cache of the highest level ``cpu`` reports in
    sysfs under ``root``; 0 when it reports none. Raises ``ValueError`` on a file it cannot
    read as a cache's level or size."""
    best = (0, 0)  # (level, bytes)
    for index in sorted((root / f"cpu{cpu}" / "cache").glob("index*")):
        try:
            kind = (index / "type").read_text().strip()
            level = int((index / "level").read_text())
            size = _cache_size((index / "size").read_text())
        except FileNotFoundError:
            continue
        except ValueError as err:
            raise ValueError(f"{index}: not a cache's level and size ({err})") from err
        if kind in ("Data", "Unified"):
            best = max(best, (level, size))
    return best[1]


def last_level_cache_bytes(device: torch.device, root: Path = CPU_CACHES) -> int:
    """The last-level cache the copy runs past on ``device`` (module docstring); 0 when not
    known."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).L2_cache_size)
    if device.type != "cpu":
        return 0
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else {0}
    return cpu_last_level_cache_bytes(min(cpus), root)


def copy_buffer_bytes(cache_bytes: int, piece_bytes: int = CEILING_PIECE_BYTES) -> int:
    """The size of each of the ceiling's two buffers: a piece, or the last-level cache when it
    is larger, so a span is evicted before the copies come back to it."""
    return max(piece_bytes, cache_bytes)


class CopyCeiling:
    """Contiguous copies of any byte count on one device, from memory (module docstring)."""

    def __init__(
        self, device: torch.device, *, buffer_bytes: int, piece_bytes: int = CEILING_PIECE_BYTES
    ) -> None:
        """Allocates both buffers of ``buffer_bytes`` (``copy_buffer_bytes`` of the device's
        cache, at least a piece) at once, before any op, so they never split the memory an
        op frees and takes again; both are written, so no copy faults its pages in."""
        self.piece_bytes = max(piece_bytes, 1)
        self.buffer_bytes = max(buffer_bytes, self.piece_bytes)
        self.src = torch.empty(self.buffer_bytes, dtype=torch.uint8, device=device)
        first = self.src[: self.piece_bytes]
        first.random_(0, 256)
        for start in range(self.piece_bytes, self.buffer_bytes, self.piece_bytes):
            rest = self.src[start : start + self.piece_bytes]
            rest.copy_(first[: rest.numel()])  # NOTE: random bytes a piece, not a buffer: faster
        self.dst = torch.zeros_like(self.src)
        self.cursor = 0

    def copy(self, nbytes: int) -> None:
        """Copies ``nbytes`` bytes from one buffer to the other, each piece from the next span
        of the buffers, so what it touches was not touched by the copies just before."""
        size = min(nbytes, self.piece_bytes)
        for start in range(0, nbytes, size):
            n = min(size, nbytes - start)
            if self.cursor + n > self.buffer_bytes:
                self.cursor = 0
            span = slice(self.cursor, self.cursor + n)
            self.dst[span].copy_(self.src[span])
            self.cursor += n
