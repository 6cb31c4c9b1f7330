"""The real-rows bench's copy ceiling: its buffers are past the device's last-level cache, read
from sysfs as Linux lays it out (real files in a temporary tree), and its copies walk the
whole of them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cpkv.bench.rows import ceiling as rows_ceiling

MIB = 1 << 20


def _cpu_caches(root: Path, cpu: int, caches: list[tuple[int, str, str]]) -> Path:
    """``root/cpuN/cache/indexM/{level,type,size}`` for each ``(level, type, size)``."""
    for index, (level, kind, size) in enumerate(caches):
        folder = root / f"cpu{cpu}" / "cache" / f"index{index}"
        folder.mkdir(parents=True)
        (folder / "level").write_text(f"{level}\n")
        (folder / "type").write_text(f"{kind}\n")
        (folder / "size").write_text(f"{size}\n")
    return root


# NOTE: the first is the 2-core Xeon VM this was found on; its L3 held the old 64 MiB pair.
XEON_VM = [(1, "Data", "48K"), (1, "Instruction", "64K"), (2, "Unified", "2048K")]
XEON_VM += [(3, "Unified", "491520K")]


@pytest.mark.parametrize(
    ("caches", "expected"),
    [
        (XEON_VM, 491520 << 10),
        ([(1, "Data", "32K"), (2, "Unified", "512K"), (3, "Unified", "32768K")], 32 * MIB),
        # the highest level counts, not the largest size; an instruction cache never does
        ([(2, "Unified", "4M"), (3, "Unified", "2M"), (4, "Instruction", "1G")], 2 * MIB),
        ([(1, "Data", "49152")], 49152),
        ([], 0),
    ],
)
def test_the_last_level_cache_is_the_highest_data_or_unified_one(
    tmp_path: Path, caches: list[tuple[int, str, str]], expected: int
) -> None:
    root = _cpu_caches(tmp_path, 3, caches)
    assert rows_ceiling.cpu_last_level_cache_bytes(3, root) == expected


def test_a_cpu_sysfs_does_not_describe_has_no_cache(tmp_path: Path) -> None:
    root = _cpu_caches(tmp_path, 0, XEON_VM)
    assert rows_ceiling.cpu_last_level_cache_bytes(1, root) == 0


def test_a_cache_size_that_is_not_one_is_refused_naming_its_file(tmp_path: Path) -> None:
    root = _cpu_caches(tmp_path, 0, [(3, "Unified", "lots")])
    with pytest.raises(ValueError, match=r"index0: not a cache's level and size"):
        rows_ceiling.cpu_last_level_cache_bytes(0, root)


@pytest.mark.parametrize(
    ("cache", "expected"),
    [(491520 << 10, 491520 << 10), (32 * MIB, 64 * MIB), (0, 64 * MIB), (64 * MIB, 64 * MIB)],
)
def test_each_buffer_is_a_piece_or_the_cache_when_that_is_larger(cache: int, expected: int) -> None:
    assert rows_ceiling.copy_buffer_bytes(cache) == expected


def test_the_copies_walk_every_span_of_the_buffers_and_wrap() -> None:
    """Copies of 384 KiB from 1 MiB pieces over 2.5 MiB buffers: the first six cover the
    buffers but a tail shorter than a copy, and the seventh starts again from the front."""
    ceiling = rows_ceiling.CopyCeiling(
        torch.device("cpu"), piece_bytes=MIB, buffer_bytes=5 * MIB // 2
    )
    assert (ceiling.buffer_bytes, ceiling.src.numel()) == (5 * MIB // 2, 5 * MIB // 2)
    step = 384 << 10
    for copies in range(1, 7):
        ceiling.copy(step)
        assert ceiling.cursor == copies * step
        assert torch.equal(ceiling.dst[: copies * step], ceiling.src[: copies * step])
    assert not ceiling.dst[6 * step :].any(), "the tail no copy reached"
    ceiling.copy(step)
    assert ceiling.cursor == step
    ceiling.copy(3 * MIB)  # more than a piece: three pieces, each from where the last ended
    assert ceiling.cursor == MIB
    assert ceiling.src[MIB:].any(), "random bytes in every piece of the source"


def test_a_copy_that_ends_at_the_buffers_end_takes_the_last_span_before_wrapping() -> None:
    """Copies of 1 MiB over 4 MiB buffers: the fourth fills the last span (wrapping before it
    would leave a quarter of the buffers untouched, and the copies run from a smaller
    working set than the buffers are sized for); the fifth starts again from the front."""
    ceiling = rows_ceiling.CopyCeiling(torch.device("cpu"), piece_bytes=MIB, buffer_bytes=4 * MIB)
    for copies in range(1, 5):
        ceiling.copy(MIB)
        assert ceiling.cursor == copies * MIB
    assert torch.equal(ceiling.dst, ceiling.src), "every span copied once"
    ceiling.copy(MIB)
    assert ceiling.cursor == MIB
