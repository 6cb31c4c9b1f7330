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

__all__ = [
    "MARKER",
    "PluginTailBytes",
    "SglangPluginFigure",
    "SglangPluginRun",
]

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


class SglangPluginRun:
    """The section's measuring process, started at once and read when its figure is wanted
    (so it runs beside the bench's other sections; its SGLang import is ~12 s of one core)."""

    def __init__(self, cp_size: int) -> None:
        missing = [n for n in ("sglang", "cpkv_sglang") if importlib.util.find_spec(n) is None]
        self.skipped = ""
        self.process: subprocess.Popen[str] | None = None
        if missing:
            self.skipped = (
                f"{' and '.join(missing)} not installed: scripts/setup.sh installs SGLang "
                "0.5.23's CP path; section skipped"
            )
            return
        self.command = [sys.executable, "-m", "cpkv_sglang.cpu.bench", "--cp-size", str(cp_size)]
        self.process = subprocess.Popen(
            self.command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def figure(self) -> SglangPluginFigure:
        """Waits for the process and reads its result line.

        Raises:
            RuntimeError: the measuring process failed (its stderr's end is in the message).
        """
        if self.process is None:
            return SglangPluginFigure(skipped=self.skipped)
        stdout, stderr = self.process.communicate(timeout=_TIMEOUT_S)
        lines = [line for line in stdout.splitlines() if line.startswith(MARKER)]
        if self.process.returncode != 0 or not lines:
            raise RuntimeError(
                f"sglang_plugin: {' '.join(self.command)} exited {self.process.returncode}: "
                f"{stderr[-2000:]}"
            )
        document = json.loads(lines[-1].removeprefix(MARKER))
        rows = [PluginTailBytes(**row) for row in document.pop("rows")]
        return SglangPluginFigure(rows=rows, **document)

    def close(self) -> None:
        """Stops the process if it still runs (a bench that failed before reading it)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.communicate()
