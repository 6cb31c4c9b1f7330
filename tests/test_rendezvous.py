"""A group's rendezvous ends on every rank together (``comm.init_process_group``).

gloo's ``init_process_group`` could return on a rank whose side of the mesh was up while a
peer was still finishing its own. A rank whose body ran no collective then reported, exited
and closed the socket under that peer: "Gloo connectFullMesh failed ... Connection closed by
peer". It takes a rank that waits for a core in the middle of its handshake: without the
barrier, on 2 cores, no group failed in 180 with the cores idle, while with other processes
spinning groups of 3 and 2 ranks failed within 2 to 18 groups, and the real test below
failed 8 runs of 8 next to two spinners (4 of 5 at 32 groups, 3 of 6 next to four). With
the barrier, 160 groups in a row passed next to five spinners.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch.distributed as dist

from cpkv_core.dist import Communicator, comm, spawn_group

GROUPS = 24
"""Rounds of a 3-rank and a 2-rank group in the real test (48 groups, about 9 s)."""
SPINNERS = 2
"""Processes that keep the cores busy while the groups start: the race needs a rank that
waits for a core in the middle of its handshake (none failed in 180 groups on idle cores)."""


@pytest.fixture
def busy_cores() -> Iterator[None]:
    """``SPINNERS`` processes spinning on the CPU, stopped after the test."""
    spin = [sys.executable, "-c", "while True: pass"]
    spinners = [subprocess.Popen(spin) for _ in range(SPINNERS)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def rank_of(group: Communicator) -> int:
    """A body with no collective: the rank returns, reports and exits at once."""
    return group.rank


@pytest.mark.gloo
def test_ranks_that_return_at_once_never_close_a_peers_rendezvous(
    forked: Iterator[None], busy_cores: Iterator[None]
) -> None:
    for _ in range(GROUPS):
        assert spawn_group(3, rank_of, timeout_s=60.0) == [0, 1, 2]
        assert spawn_group(2, rank_of, timeout_s=60.0) == [0, 1]


@pytest.mark.parametrize(
    ("backend", "barrier"), [("gloo", {}), ("nccl", {"device_ids": [3]})], ids=["gloo", "nccl"]
)
def test_the_rendezvous_returns_after_a_barrier_of_the_whole_group(
    monkeypatch: pytest.MonkeyPatch, backend: str, barrier: dict[str, object]
) -> None:
    """The order of the calls, torch.distributed stood in for (the real group is above):
    init, then one barrier, on NCCL on the device the caller set."""
    calls: list[tuple[str, dict[str, object]]] = []
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: calls.append(("init", kw)))
    monkeypatch.setattr(dist, "barrier", lambda **kw: calls.append(("barrier", kw)))
    monkeypatch.setattr(comm.torch.cuda, "current_device", lambda: 3)
    comm.init_process_group(1, 2, "file:///nowhere", backend, 5.0)
    assert [name for name, _ in calls] == ["init", "barrier"]
    assert calls[0][1]["backend"] == backend and calls[0][1]["rank"] == 1
    assert calls[1][1] == barrier
