"""``sglang_plugin``: what SGLang 0.5.23's tail all-gather moves per CP rank, as shipped and
with cpkv's plugin (phase 1), at DeepSeek-V3.2's hidden size (7,168 x bf16) for bs 1-64,
measured on SGLang's own code path (``EagerRunner._execute_extend_cp`` on CPU ranks).

The app never imports the plugin: the figure runs ``python -m cpkv_sglang.cpu.bench`` in a
process of its own, which loads cpkv the way a server does (SGLang's ``load_plugins()``
and the entry point), and reads its result line. Without SGLang's CP path installed
(``scripts/setup.sh``), the section says it is skipped.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["MARKER", "PluginTailBytes", "SglangPluginFigure", "sglang_plugin_figure"]

MARKER = "cpkv-sglang-plugin-bench "
"""The result line's prefix (``cpkv_sglang/cpu/bench.py``)."""
_TIMEOUT_S = 900.0


@dataclass(frozen=True, slots=True)
class PluginTailBytes:
    """One batch size: the tail all-gather's rows and bytes per rank, stock and plugin."""

    bs: int
    tokens: int
    stock_rows: int
    plugin_rows: int
    stock_bytes: int
    plugin_bytes: int

    @property
    def ratio(self) -> float:
        """Plugin bytes over stock bytes."""
        return self.plugin_bytes / self.stock_bytes


@dataclass(frozen=True, slots=True)
class SglangPluginFigure:
    """The section; ``skipped`` says why when it did not run."""

    skipped: str = ""
    cp_size: int = 0
    strategy: str = ""
    hidden: int = 0
    dtype: str = ""
    tokens_per_request: int = 0
    rows: list[PluginTailBytes] = field(default_factory=list)
    logits_bitwise_equal: bool = False
    """Every rank's logits of every batch equal SGLang's as shipped, bit for bit."""

    def to_json(self) -> dict[str, Any]:
        """The ``sglang_plugin`` object of ``cpkv bench --json``."""
        document = asdict(self)
        document["rows"] = [asdict(row) | {"ratio": row.ratio} for row in self.rows]
        return document


def sglang_plugin_figure(cp_size: int) -> SglangPluginFigure:
    """Measures the section on ``cp_size`` CPU ranks, or says why it is skipped.

    Raises:
        RuntimeError: the measuring process failed (its stderr's end is in the message).
    """
    missing = [name for name in ("sglang", "cpkv_sglang") if importlib.util.find_spec(name) is None]
    if missing:
        return SglangPluginFigure(
            skipped=f"{' and '.join(missing)} not installed: scripts/setup.sh installs SGLang "
            "0.5.23's CP path; section skipped"
        )
    command = [sys.executable, "-m", "cpkv_sglang.cpu.bench", "--cp-size", str(cp_size)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=_TIMEOUT_S)
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARKER)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(
            f"sglang_plugin: {' '.join(command)} exited {done.returncode}: {done.stderr[-2000:]}"
        )
    document = json.loads(lines[-1].removeprefix(MARKER))
    rows = [PluginTailBytes(**row) for row in document.pop("rows")]
    return SglangPluginFigure(rows=rows, **document)
