"""``cpkv bench --rows``' figures read off the entries: the projection of one chunk over every
layer at each level (which ops each level runs, per layer and per chunk), and slot against
unique remap per chunk (every layer's view plus the host plan once, and the winner). The
entries are built by hand (no op is run, no timing is measured): each op's bytes are a bit
of its own and its seconds those bytes over 1,024, so every sum is exact and names the ops
it took."""

from __future__ import annotations

import pytest

from cpkv.bench.rows.figures import TIE_BAND, RowsEntry, projection, slot_vs_unique
from cpkv.bench.rows.timing import Timing

LAYERS = 3
"""Layers the projection multiplies the per-layer ops by."""
HISTORY, BS, CP = 128, 2, 2
LAYER_OPS = {
    ("write", "replicated"): 1 << 0,
    ("rollback-save", "replicated"): 1 << 1,
    ("write", "owner-filtered"): 1 << 2,
    ("rollback-save", "owner-filtered"): 1 << 3,
    ("write", "direct"): 1 << 4,
    ("rollback-save", "direct"): 1 << 5,
    ("view", "slot"): 1 << 6,
    ("view", "unique"): 1 << 7,
    ("view", "peer-read"): 1 << 8,
    ("view", "peer-read-unique"): 1 << 9,
    ("current-gather", "all-gather"): 1 << 10,
    ("pd-pack", "owned-pages"): 1 << 11,
}
"""Each per-layer op's bytes at the point: one bit each."""
CHUNK_OPS = {("tail", "full"): 1 << 16, ("tail", "narrow"): 1 << 17}
"""The tail's bytes (once a chunk)."""


def entry(
    op: str,
    variant: str,
    nbytes: int,
    seconds: float,
    *,
    history: int = HISTORY,
    shared_prefix: bool = False,
    plan_seconds: float | None = None,
) -> RowsEntry:
    """One op at one point (bs 2, cp 2) whose every round took ``seconds``."""
    return RowsEntry(
        op=op,
        variant=variant,
        history=history,
        cp_size=CP,
        bs=BS,
        shared_prefix=shared_prefix,
        per="chunk" if op == "tail" else "layer",
        levels=(),
        bytes=nbytes,
        timing=Timing((seconds,), (seconds,)),
        scratch_bytes=0,
        planned_scratch_bytes=None,
        budget="-",
        plan_seconds=plan_seconds,
    )


def point_entries(shared_prefix: bool = False) -> list[RowsEntry]:
    """Every op of the point, its seconds its bytes over 1,024."""
    ops = LAYER_OPS | CHUNK_OPS
    return [
        entry(op, variant, bits, bits / 1024, shared_prefix=shared_prefix)
        for (op, variant), bits in ops.items()
    ]


def ops_by_hand(level: int, read: str) -> tuple[list[tuple[str, str]], tuple[str, str]]:
    """What a history batch runs at ``level``, from the levels' definitions: replicated
    writes below level 2 (a full tail at level 0 alone), owner-filtered writes and a view at
    2-4, direct writes and a view at 5, where peer-read needs the chunk's gather too."""
    if level in (0, 1):
        layer = [("write", "replicated"), ("rollback-save", "replicated")]
        return layer, ("tail", "full" if level == 0 else "narrow")
    kept = "direct" if level == 5 else "owner-filtered"
    layer = [("write", kept), ("rollback-save", kept), ("view", read)]
    if level == 5 and read == "peer-read":
        layer.append(("current-gather", "all-gather"))
    return layer, ("tail", "narrow")


def test_the_projection_runs_each_levels_own_ops_over_every_layer() -> None:
    """Per read and level: the per-layer ops that level runs, times the layers, and its tail
    once; a shared-prefix twin (slot and unique differ there alone) is left out."""
    entries = point_entries() + point_entries(shared_prefix=True)
    rows = projection(entries, LAYERS)
    assert [(r.read, r.level) for r in rows] == [
        (read, level) for read in ("slot", "unique", "peer-read") for level in range(6)
    ]
    for row in rows:
        assert (row.history, row.bs, row.cp_size) == (HISTORY, BS, CP)
        layer, tail = ops_by_hand(row.level, row.read)
        expected = LAYERS * sum(LAYER_OPS[op] for op in layer) + CHUNK_OPS[tail]
        assert row.bytes == expected, (row.read, row.level, row.bytes, expected)
        assert row.seconds == expected / 1024, (row.read, row.level)
        level0 = next(r for r in rows if (r.read, r.level) == (row.read, 0))
        assert row.seconds_vs_level0 == row.seconds - level0.seconds


def view_pair(history: int, shared: bool, reads: dict[str, tuple[float, float]]) -> list[RowsEntry]:
    """The four views of one point; ``reads`` gives each variant's (seconds a layer, plan
    seconds). Bytes are the seconds' share of a MB, so they never decide a winner."""
    return [
        entry(
            "view",
            variant,
            round(seconds * 1e6),
            seconds,
            history=history,
            shared_prefix=shared,
            plan_seconds=plan,
        )
        for variant, (seconds, plan) in reads.items()
    ]


def test_slot_against_unique_counts_every_layer_and_the_plan_once_and_names_the_faster() -> None:
    """Per chunk: each remap's view over every layer plus its host plan once (not a layer);
    the faster remap wins, and two within ``TIE_BAND`` of the slower are a tie."""
    layers = 10
    entries = [
        # gather: unique 2 ms a layer + 3 ms plan = 23 ms, slot 4 ms + 1 ms = 41 ms
        # peer-read: slot 1 ms + 1 ms = 11 ms, unique 3 ms + 1 ms = 31 ms
        *view_pair(
            128,
            True,
            {
                "slot": (0.004, 0.001),
                "unique": (0.002, 0.003),
                "peer-read": (0.001, 0.001),
                "peer-read-unique": (0.003, 0.001),
            },
        ),
        # within the band: 10 ms + 0.5 ms against 10 ms, under either read
        *view_pair(
            256,
            False,
            {
                "slot": (0.001, 0.0005),
                "unique": (0.001, 0.0),
                "peer-read": (0.001, 0.0),
                "peer-read-unique": (0.001, 0.0005),
            },
        ),
        entry("write", "direct", 1, 1.0),  # NOTE: not a view: in no verdict
    ]
    verdicts = {(v.history, v.read): v for v in slot_vs_unique(entries, layers)}
    assert set(verdicts) == {(h, r) for h in (128, 256) for r in ("gather", "peer-read")}
    gather = verdicts[128, "gather"]
    assert (gather.slot_seconds, gather.unique_seconds) == pytest.approx((0.041, 0.023))
    assert (gather.slot_plan_seconds, gather.unique_plan_seconds) == (0.001, 0.003)
    assert (gather.slot_bytes, gather.unique_bytes) == (layers * 4000, layers * 2000)
    assert gather.shared_prefix and gather.winner == "unique"
    peer = verdicts[128, "peer-read"]
    assert (peer.slot_seconds, peer.unique_seconds) == pytest.approx((0.011, 0.031))
    assert peer.winner == "slot"
    for read in ("gather", "peer-read"):
        close = verdicts[256, read]
        slower = max(close.slot_seconds, close.unique_seconds)
        assert abs(close.slot_seconds - close.unique_seconds) <= TIE_BAND * slower
        assert close.winner == "tie", read
    assert gather.to_json()["winner"] == "unique"
