"""``python -m cpkv_sglang.cpu.bench``: the bytes SGLang 0.5.23's tail all-gather moves, as
shipped and with cpkv's phase 1 (``tail_bytes.measure``); ``cpkv bench``'s ``sglang_plugin``
section runs it in a process of its own (the app never imports the plugin) and reads the
last line, ``MARKER`` and a JSON document.

It starts its ranks' fork server before it imports torch or cpkv (``preload``): SGLang's
import in the server then runs beside its own (18.7 -> 14.3 s a run on a 2-core EPYC).
"""

from __future__ import annotations

import argparse
import json

from cpkv_sglang.cpu.preload import PRELOAD, start_fork_server

__all__ = ["MARKER", "main"]

MARKER = "cpkv-sglang-plugin-bench "
"""Prefix of the result line on stdout."""


def main(argv: list[str] | None = None) -> None:
    """Prints ``MARKER`` and the document of ``tail_bytes.measure`` as the last line."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cp-size", type=int, default=4)
    args = parser.parse_args(argv)
    start_fork_server()
    # NOTE: imported once the server imports SGLang (module docstring).
    from cpkv_core.dist.start_method import adopt_fork_server
    from cpkv_sglang.cpu.tail_bytes import measure

    adopt_fork_server(PRELOAD)
    print(MARKER + json.dumps(measure(args.cp_size)), flush=True)


if __name__ == "__main__":
    main()
