"""The shadow comparison's verdict on two runs of one batch: which difference it names first.

The runs here are built by hand, as the loop's would be (``tests/test_shadow.py`` runs the
real engine with injected faults); a top-k that differs while every output agrees is what a
fault in the engine cannot make on purpose.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from cpkv_core.runtime.kv_pool import KVRows
from cpkv_core.runtime.outputs import OUTPUT_ATOL, Served, StepOutput
from cpkv_core.runtime.shadow import _WHAT, _Run, _verdict


def _rows(value: float) -> KVRows:
    return KVRows(torch.full((2, 4), value), torch.zeros(2, 3), torch.ones(2))


def _run(
    hidden: float = 0.5,
    topk: tuple[int, ...] = (0, 1),
    read: float = 1.0,
    written: float = 2.0,
    attended: Any = ("same",),
) -> _Run:
    step = StepOutput(torch.zeros(1, 2, 2), torch.full((1, 4), hidden), torch.zeros(1, 8))
    host: Any = SimpleNamespace(attended=attended)
    served = Served(host, tensors=None, step=step)  # type: ignore[arg-type]
    return _Run(served, [_rows(read)], torch.tensor([topk]), [_rows(written)])


@pytest.mark.parametrize(
    ("candidate", "what"),
    [
        (_run(), ""),
        (_run(hidden=0.5 + OUTPUT_ATOL / 2), ""),
        (_run(hidden=0.5 + 10 * OUTPUT_ATOL), "outputs"),
        (_run(topk=(1, 0)), "top-k"),
        (_run(topk=(0, 2), written=3.0), "top-k"),
        (_run(read=9.0), "rows read"),
        (_run(read=9.0, attended=("split otherwise",)), ""),
        (_run(written=3.0), "rows written"),
    ],
    ids=[
        "equal",
        "within-tolerance",
        "outputs",
        "top-k-only",
        "top-k-before-rows",
        "rows-read",
        "reads-of-other-splits",
        "rows-written",
    ],
)
def test_the_verdict_names_the_first_difference(candidate: _Run, what: str) -> None:
    code, diff = _verdict(candidate, _run())
    assert _WHAT[code] == what
    hidden = float(candidate.served.step.last_hidden[0, 0])
    assert diff == pytest.approx(abs(hidden - 0.5))
