"""The decode server's receive arena against a byte map: any run of allocations and frees
places each slab where first fit over the merged free ranges places it, and refuses one only
when no run of free bytes holds it."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

from cpkv_core.pd.receive import ArenaFullError, ReceiveArena

BUFFER_BYTES = 64


class _Registry:
    """The one transport call an arena makes: registering its buffer (the transport itself
    is tested over loopback in ``test_pd*.py``)."""

    def __init__(self) -> None:
        self.registered: list[Tensor] = []

    def register(self, tensors: Sequence[Tensor]) -> None:
        self.registered += tensors


def first_fit(owners: list[str | None], nbytes: int) -> int | None:
    """Where first fit puts ``nbytes`` in the byte map ``owners``: the start of the first
    maximal run of free bytes that holds it."""
    start = 0
    while start < len(owners):
        if owners[start] is not None:
            start += 1
            continue
        stop = start
        while stop < len(owners) and owners[stop] is None:
            stop += 1
        if stop - start >= nbytes:
            return start
        start = stop
    return None


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.booleans(), st.integers(0, 5), st.integers(0, BUFFER_BYTES)), max_size=40)
)
def test_slabs_land_where_first_fit_over_merged_free_ranges_puts_them(
    steps: list[tuple[bool, int, int]],
) -> None:
    registry = _Registry()
    arena = ReceiveArena(BUFFER_BYTES, registry)  # type: ignore[arg-type]
    assert registry.registered == [arena.buffer]
    owners: list[str | None] = [None] * BUFFER_BYTES
    live: set[str] = set()
    for allocate, index, nbytes in steps:
        key = f"r{index}"
        if not allocate or key in live:
            arena.free(key)
            owners = [None if owner == key else owner for owner in owners]
            live.discard(key)
            continue
        expected = 0 if nbytes == 0 else first_fit(owners, nbytes)
        if expected is None:
            with pytest.raises(ArenaFullError, match=f"no {nbytes} free bytes in one range"):
                arena.alloc(key, nbytes)
            continue
        assert arena.alloc(key, nbytes) == expected
        assert arena.slab(key) == (expected, nbytes)
        owners[expected : expected + nbytes] = [key] * nbytes
        live.add(key)
