"""How ``spawn_group`` starts its processes: a fresh interpreter each (``spawn``, the default),
or, inside ``forked_ranks``, a fork of one server process that imported the heavy modules
once (``forkserver``).

A fresh interpreter imports torch and the rank's modules again, seconds of CPU a process,
and without a bytecode cache (``PYTHONDONTWRITEBYTECODE``) it compiles every module's source
too: 4 ranks took 12.6-16.6 s to start and meet on this 2-core machine at a load of 7-9, and
0.3 s forked (2.8 s for the first group, which starts the server). The server is started once a process, on the first
start inside the block, with the environment, working directory and ``sys.path`` of that
moment, so a run that changes them between groups should not use it; torch in the server has
run no op, so no thread pool is forked.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from multiprocessing.context import ForkServerContext, SpawnContext

__all__ = ["forked_ranks", "rank_context"]

_lock = threading.Lock()
_forking = [0]
"""Blocks of ``forked_ranks`` open now, in any thread."""


@contextmanager
def forked_ranks(preload: Sequence[str] = ()) -> Iterator[None]:
    """Inside the block every ``spawn_group`` forks its ranks from the server process, which
    imports torch, this harness and ``preload`` (module names; ``__main__``: the program's
    main module, which each rank would import again otherwise) when it first starts."""
    with _lock:
        if not _forking[0]:
            modules = ["torch", "cpkv_core.dist.rank_child", *preload]
            # NOTE: only read when the server starts, the first time a block forks.
            mp.set_forkserver_preload(list(dict.fromkeys(modules)))
        _forking[0] += 1
    try:
        yield
    finally:
        with _lock:
            _forking[0] -= 1


def rank_context() -> SpawnContext | ForkServerContext:
    """The start method of ranks started now (module docstring)."""
    if _forking[0]:
        return mp.get_context("forkserver")
    return mp.get_context("spawn")
