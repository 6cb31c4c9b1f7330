"""What the real-rows bench measures an op with: the page faults of a call, the peak of the
temporaries one call allocates, and a CPU allocator that holds what it is handed back
(``ceiling`` is what an op is measured against, ``rounds`` times the rounds).

- **Scratch.** On CUDA, the caching allocator's peak over one call; on the CPU, the
  profiler's record of every allocation and free during one call, summed in order.
- **The CPU allocator.** A device's caching allocator hands a freed block to the next
  tensor of its size. glibc returns blocks of tens of MB to the system on free, so on the
  CPU every fresh tensor of that size is page-faulted in again on first touch: a plain
  ``clone`` runs at about a third of ``copy_`` into an existing tensor. ``reusing_allocator``
  makes glibc keep every freed byte (``mallopt``) for the run, as a caching allocator
  would. It still places a call's temporaries by best fit, which for several calls after
  an op's sizes first appear is memory past what the heap has touched, and now and then a
  call in held memory followed by one in fresh memory again; ``rounds.warm_up`` waits
  until ``SETTLED_CALLS`` calls in a row take no faults (``faulted``), and
  ``Timing.page_faults`` counts those the timed calls still took. A timed round that
  faulted is set aside and run again (``rounds.time_op``), a bounded number of times.
  Nothing is handed back between ops: pages handed back inside the heap (``malloc_trim``)
  are where glibc places the next op's temporaries, so each of its calls faulted them in
  again, up to 4x its time. glibc still trims the heap's top on a free once the top's free
  bytes pass the trim threshold, which ``mallopt`` caps at 2 GiB: after a point freed more
  than that, every call of the next op gave its buffers back on free and faulted them in
  again (``tail/full`` at 128K, bs 4, cp 4: 0.18 of the copy in every round, 0.02 s of work
  taking 0.15 s). So the top keeps a pad of 2 GiB as well (``M_TOP_PAD``): a trim leaves
  that much, from where the next allocation is taken.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

__all__ = [
    "Clock",
    "faulted",
    "minor_faults",
    "peak_scratch",
    "reusing_allocator",
    "sync",
]

FAULT_SHARE = 0.02
"""A warm call faults in at most this share of the bytes it writes."""
PAGE_BYTES = 4096
"""Bytes of one page (what one minor fault brings in)."""

_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_MAX = -4
_GLIBC_MMAP_MAX = 65536
_GLIBC_TRIM_THRESHOLD = 128 * 1024
_GLIBC_TOP_PAD = 128 * 1024
_KEEP_FREED = 2**31 - 1
"""The largest trim threshold and top pad ``mallopt`` takes (an ``int``): glibc keeps what
is freed up to 2 GiB of free top, and a trim past it keeps 2 GiB (module docstring)."""


def sync(device: torch.device) -> None:
    """Waits for the device's queued work (CUDA); no-op on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


Clock = Callable[[], float]


def minor_faults() -> int:
    """Minor page faults this process has taken so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def faulted(faults: int, nbytes: int, device: torch.device) -> bool:
    """A call on the CPU faulted in more than ``FAULT_SHARE`` of ``nbytes`` (a device's
    caching allocator takes no faults: never)."""
    return device.type == "cpu" and faults * PAGE_BYTES > FAULT_SHARE * nbytes


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silences file descriptor 2 (kineto logs every profiler start and stop there)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _allocations(prof: torch.profiler.profile, device_type: str) -> list[tuple[int, int]]:
    """``(time, bytes)`` of every allocation (+) and free (-) on ``device_type``."""
    from torch._C._profiler import _EventType

    events: list[tuple[int, int]] = []
    todo = list(prof.profiler.kineto_results.experimental_event_tree())  # type: ignore[union-attr]
    while todo:
        node = todo.pop()
        todo.extend(node.children)
        kind, fields = node.typed
        if kind == _EventType.Allocation and fields.device.type == device_type:
            events.append((node.start_time_ns, fields.alloc_size))
    return sorted(events)


def peak_scratch(run: Callable[[], object], device: torch.device) -> int:
    """Peak bytes of the tensors one call of ``run`` allocates (and frees) on ``device``."""
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        run()
        sync(device)
        return int(torch.cuda.max_memory_allocated(device) - base)
    activities = [torch.profiler.ProfilerActivity.CPU]
    with _quiet_stderr(), torch.profiler.profile(activities=activities, profile_memory=True) as p:
        run()
    live = peak = 0
    for _, size in _allocations(p, device.type):
        live += size
        peak = max(peak, live)
    return peak


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None or not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


@contextmanager
def reusing_allocator(device: torch.device) -> Iterator[str]:
    """For the run, glibc keeps all the memory it is handed back, for the next allocation
    (module docstring); afterwards it returns it to the system.

    Yields:
        The run's allocator: ``caching`` (a device's, or glibc keeping freed memory) or
        ``system`` (no glibc to tell: fresh CPU tensors pay their page faults).
    """
    if device.type != "cpu":
        yield "caching"
        return
    libc = _libc()
    if libc is None:
        yield "system"
        return
    libc.mallopt(_M_MMAP_MAX, 0)
    libc.mallopt(_M_TRIM_THRESHOLD, _KEEP_FREED)
    libc.mallopt(_M_TOP_PAD, _KEEP_FREED)
    try:
        yield "caching"
    finally:
        libc.mallopt(_M_MMAP_MAX, _GLIBC_MMAP_MAX)
        libc.mallopt(_M_TRIM_THRESHOLD, _GLIBC_TRIM_THRESHOLD)
        libc.mallopt(_M_TOP_PAD, _GLIBC_TOP_PAD)
        libc.malloc_trim(0)
