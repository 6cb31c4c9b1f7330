"""``scripts/rows_tables.py``: how one rows run's figures sit in another's spreads, the
yardstick docs/real-rows.md reads a run next to ``yes`` against."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from tests.scripts_loader import load_script


@pytest.fixture(scope="module")
def tables() -> ModuleType:
    return load_script("rows_tables")


def _run(figures: dict[int, tuple[float, float, float]], history: int = 131072) -> Any:
    """A run whose entry at ``bs`` has ``(ratio, low, high)``, plus one shorter-history entry
    that no comparison may read."""
    rows = [
        {
            "op": "view",
            "variant": "slot",
            "shared_prefix": False,
            "history": h,
            "bs": bs,
            "cp_size": 2,
            "ratio_to_copy": ratio,
            "ratio_low": low,
            "ratio_high": high,
        }
        for h, items in ((history, figures.items()), (8192, [(1, (9.0, 9.0, 9.0))]))
        for bs, (ratio, low, high) in items
    ]
    return {"real_rows": rows}


FIRST = _run({1: (1.0, 0.9, 1.1), 2: (1.0, 0.9, 1.1), 3: (1.0, 0.9, 1.1), 4: (0.5, 0.4, 0.6)})
SECOND = _run({1: (1.1, 1.05, 1.2), 2: (0.89, 0.8, 0.95), 3: (1.3, 1.15, 1.4), 4: (0.6, 0.6, 0.6)})
"""Against FIRST: bs 1 on the spread's top edge (inside), bs 2 just under it (outside, spreads
overlap), bs 3 above it (outside, spreads apart), bs 4 on the top edge (inside)."""


def test_a_figure_on_the_spread_s_edge_is_inside_and_a_shorter_history_is_not_read(
    tables: ModuleType,
) -> None:
    got = tables.compare(FIRST, SECOND)
    assert got.longest == 131072
    assert [k[4] for k in got.keys] == [1, 2, 3, 4]
    assert [k[4] for k in got.inside] == [1, 4]
    assert got.overlap == 3
    assert got.moves[got.keys[3]] == pytest.approx(0.2)


def test_the_sentence_names_every_figure_outside_and_the_largest_move(tables: ModuleType) -> None:
    text = tables.agreement(FIRST, SECOND)
    assert text.startswith("4 entries at 131072: 2 with the second run's ratio inside")
    assert "3 whose spreads overlap" in text
    assert "at most 30.0% (view/slot bs 3 cp 2: 1.00 -> 1.30)" in text
    assert "view/slot bs 2 cp 2: 0.89 against 0.90-1.10" in text
    assert "bs 1 cp 2:" not in text.split("Outside:")[1]


def test_every_ordered_pair_is_read_against_its_own_first_run(tables: ModuleType) -> None:
    """The comparison is not symmetric: the second run's spreads hold other figures."""
    third = _run({1: (1.0, 0.9, 1.1), 2: (1.0, 0.9, 1.1), 3: (1.0, 0.9, 1.1), 4: (0.5, 0.4, 0.6)})
    table = tables.agreement_table([FIRST, SECOND, third], ["idle", "busy", "idle again"])
    rows = [line.split(" | ") for line in table.splitlines()[2:]]
    assert len(rows) == 6
    cells = {(r[0].strip("| "), r[1]): r[2] for r in rows}
    assert cells["idle", "busy"] == "2 of 4"
    assert cells["busy", "idle"] == "0 of 4"  # 1.0 and 0.5 lie in none of the busy spreads
    assert cells["idle", "idle again"] == "4 of 4"
