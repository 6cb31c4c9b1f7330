"""How ``spawn_group`` starts its processes: a fresh interpreter each (``spawn``, the default),
or, inside ``forked_ranks`` or with modules to preload, a fork of one server process that
imported the heavy modules once (``forkserver``).

The fork server is one a process and reads its preload list only when it starts, so
:func:`forkserver_context` restarts it when a caller asks for a module it does not hold (the
bench's ranks want torch; the SGLang plugin's want SGLang, ~12 s of CPU a process that
imports it): the list only grows, and a server that holds every module asked for is kept.

A fresh interpreter imports torch and the rank's modules again, seconds of CPU a process,
and without a bytecode cache (``PYTHONDONTWRITEBYTECODE``) it compiles every module's source
too: 4 ranks took 12.6-16.6 s to start and meet on this 2-core machine at a load of 7-9, and
0.3 s forked (2.8 s for the first group, which starts the server). The server is started
once a process, on the first start inside the block, with the environment, working directory
and ``sys.path`` of that moment, so a run that changes them between groups should not use
it; torch in the server has run no op, so no thread pool is forked. A preload that names
``__main__`` has the server run the program's main script once (``forkserver_main``:
CPython's own ``__main__`` preload does nothing before 3.13.8, so each rank ran the script
again). A program may start the server itself, before it imports torch, and hand it over
(``adopt_fork_server``): its imports and the server's then run side by side.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from multiprocessing import spawn
from multiprocessing.context import ForkServerContext, SpawnContext

__all__ = ["adopt_fork_server", "forked_ranks", "rank_context"]

_lock = threading.Lock()
_forking = [0]
"""Blocks of ``forked_ranks`` open now, in any thread."""
_preload: list[str] = []
"""The modules the fork server holds (or will, when it next starts)."""
_BASE = ("torch", "cpkv_core.dist.rank_child")
_MAIN = "__main__"
_MAIN_LOADER = "cpkv_core.dist.forkserver_main"
"""What the server imports for ``__main__`` (that module's docstring: CPython's own
``__main__`` preload loads nothing up to 3.13.7)."""
MAIN_PATH_ENV = "CPKV_FORKSERVER_MAIN"
"""``<pid>:<path>``: the process that starts the fork server, and its main script's path as
its ``spawn.get_preparation_data`` gives it (read by ``forkserver_main``)."""


def main_path_entry(pid: int, path: str) -> str:
    """The value of ``MAIN_PATH_ENV`` for the fork server of process ``pid``."""
    return f"{pid}:{path}"


@contextmanager
def forked_ranks(preload: Sequence[str] = ()) -> Iterator[None]:
    """Inside the block every ``spawn_group`` forks its ranks from the server process, which
    imports torch, this harness and ``preload`` (module names; ``__main__``: the program's
    main module, which each rank would import again otherwise) when it first starts."""
    with _lock:
        _want(preload)
        _forking[0] += 1
    try:
        yield
    finally:
        with _lock:
            _forking[0] -= 1


def adopt_fork_server(preload: Sequence[str]) -> None:
    """Takes the fork server this process started itself, with ``multiprocessing``'s own
    ``set_forkserver_preload`` of torch, this harness and ``preload`` and ``ensure_running``,
    as the one that holds them: the next ``spawn_group`` forks from it instead of restarting
    it. A program that starts its server so before it imports torch has the two imports run
    side by side (``cpkv_sglang.cpu.bench``: SGLang's ~12 s beside its own 3 s).

    Raises:
        RuntimeError: the server's list is not torch, this harness and ``preload``, or this
            process already asked for a list (the server it started was not the first).
    """
    from multiprocessing import forkserver

    wanted = [*_BASE, *preload]
    held = list(forkserver._forkserver._preload_modules)  # type: ignore[attr-defined]
    with _lock:
        if _preload or held != wanted:
            raise RuntimeError(
                f"the fork server to adopt preloads {held}, and this process asked for "
                f"{_preload or 'nothing'}; adopting it needs exactly {wanted}, asked for "
                "nothing yet (indicates a bug in the caller)"
            )
        _preload.extend(wanted)


def rank_context(preload: Sequence[str] = ()) -> SpawnContext | ForkServerContext:
    """The start method of ranks started now (module docstring): forked from the server when
    inside ``forked_ranks`` or when ``preload`` names modules, else spawned."""
    if preload:
        with _lock:
            _want(preload)
    if _forking[0] or preload:
        return mp.get_context("forkserver")
    return mp.get_context("spawn")


def _want(preload: Sequence[str]) -> None:
    """The fork server holds ``preload`` from now on: restarted if it runs without them."""
    missing = [m for m in (*_BASE, *preload) if m not in _preload]
    if not missing:
        return
    _preload.extend(missing)
    # NOTE: the running server (if any) was started with the old list and never reads a new
    # one; stopping it makes the next fork start one that imports every module wanted.
    from multiprocessing import forkserver

    forkserver._forkserver._stop()  # type: ignore[attr-defined]  # the only way to restart it
    mp.set_forkserver_preload([_server_module(m) for m in _preload])


def _server_module(name: str) -> str:
    """The module the server imports for ``name``: ``forkserver_main`` for ``__main__``, told
    the main script's path (none where the main module came by name or has no file)."""
    if name != _MAIN:
        return name
    path = spawn.get_preparation_data("cpkv-forkserver").get("init_main_from_path")
    if path:
        os.environ[MAIN_PATH_ENV] = main_path_entry(os.getpid(), path)
    return _MAIN_LOADER
