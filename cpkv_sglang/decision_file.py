"""The plugin's decision log: every gate decision and tail gather appended to
``CPKV_DECISION_LOG`` as a JSON line (:class:`DecisionFile`), for ``cpkv explain
--decision-log``.

Every CP rank decides the same batches, so one rank's file says it all: with ``{rank}`` in
the path each rank writes its own file, otherwise rank 0 alone writes. The file is opened on
the first record, when torch.distributed knows the rank, and each line is flushed as written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO

from phases.decision_log import DecisionRecord, TailRecord

__all__ = ["DecisionFile"]


class DecisionFile:
    """Appends records to a path template (``{rank}`` is the rank)."""

    def __init__(self, template: str) -> None:
        self.template = template
        self._out: IO[str] | None = None
        self._silent = False

    def write(self, record: DecisionRecord | TailRecord) -> None:
        """Appends one record (a ``decision`` or a ``tail`` line)."""
        out = self._open()
        if out is None:
            return
        kind = "decision" if isinstance(record, DecisionRecord) else "tail"
        out.write(json.dumps({kind: record.to_json()}) + "\n")
        out.flush()

    def _open(self) -> IO[str] | None:
        if self._out is not None or self._silent:
            return self._out
        rank = _rank()
        if "{rank}" not in self.template and rank != 0:
            self._silent = True
            return None
        path = Path(self.template.replace("{rank}", str(rank)))
        path.parent.mkdir(parents=True, exist_ok=True)
        self._out = path.open("a", encoding="utf-8")
        return self._out


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
