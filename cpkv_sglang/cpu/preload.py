"""What the CPU ranks' fork server imports, and its start before anything imports torch.

Standard library only: ``python -m cpkv_sglang.cpu.bench`` starts the server first, so that
SGLang's import in the server (~12 s of CPU) runs beside its own import of torch and cpkv
(~3 s) instead of after it, then hands it to ``cpkv_core.dist`` (``adopt_fork_server``).
"""

from __future__ import annotations

import multiprocessing as mp
from multiprocessing import forkserver

__all__ = ["PRELOAD", "SERVER_MODULES", "start_fork_server"]

PRELOAD = (
    "cpkv_sglang.cpu.ranks",
    "cpkv_sglang.plugin",
    "cpkv_sglang.tail",
    "sglang.srt.server_args",
    "sglang.srt.layers.cp.utils",
    "sglang.srt.layers.logits_processor",
    "sglang.srt.model_executor.runner.eager_runner",
    "sglang.srt.layers.attention.dsa_backend",
    "sglang.srt.plugins",
)
"""What the fork server imports once for the ranks (SGLang's import takes ~12 s of CPU)."""
SERVER_MODULES = ("torch", "cpkv_core.dist.rank_child", *PRELOAD)
"""The server's whole list, as ``cpkv_core.dist`` gives it for ``PRELOAD`` (its own modules
first); ``adopt_fork_server`` refuses a server started with any other."""


def start_fork_server() -> None:
    """Starts this process's fork server on ``SERVER_MODULES`` and returns while it imports."""
    mp.set_forkserver_preload(list(SERVER_MODULES))
    forkserver.ensure_running()
