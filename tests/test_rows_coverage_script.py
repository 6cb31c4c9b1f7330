"""``scripts/rows_coverage.py``: how often a run's ratio falls inside another's spread, for a
number of passes a run, from the instances of the runs given."""

from __future__ import annotations

import random
from types import ModuleType
from typing import Any

import pytest

from tests.scripts_loader import load_script


@pytest.fixture(scope="module")
def coverage_script() -> ModuleType:
    return load_script("rows_coverage")


def _entry(bs: int, instances: list[list[tuple[float, float]]], history: int = 4096) -> Any:
    rounds = [r for instance in instances for r in instance]
    return {
        "op": "pd-pack",
        "variant": "owned-pages",
        "shared_prefix": False,
        "history": history,
        "bs": bs,
        "cp_size": 2,
        "op_rounds": [op for op, _ in rounds],
        "copy_rounds": [copy for _, copy in rounds],
        "placement_rounds": [len(instance) for instance in instances],
    }


def test_instances_are_split_by_their_rounds_and_read_at_the_longest_history(
    coverage_script: ModuleType,
) -> None:
    run = {
        "real_rows": [
            _entry(1, [[(1.0, 0.8), (1.1, 0.8)], [(2.0, 0.8)]]),
            _entry(1, [[(9.0, 9.0)]], history=1024),
        ]
    }
    pooled = coverage_script.instances([run, run])
    assert list(pooled.values()) == [[((1.0, 0.8), (1.1, 0.8)), ((2.0, 0.8),)] * 2]
    firsts = coverage_script.instances([run], rounds_each=1)
    assert list(firsts.values()) == [[((1.0, 0.8),), ((2.0, 0.8),)]]
    del run["real_rows"][0]["placement_rounds"]
    with pytest.raises(ValueError, match="placement_rounds"):
        coverage_script.instances([run])


def test_a_run_of_every_instance_holds_the_next_and_one_instance_does_not(
    coverage_script: ModuleType,
) -> None:
    """Two instances that disagree (0.8 and 0.4 of the copy), rounds that agree: one instance
    a run holds the next run only when both drew the same; two hold it every time."""
    runs = [{"real_rows": [_entry(bs, [[(1.0, 0.8)], [(2.0, 0.8)]]) for bs in (1, 2, 4)]}]
    pooled = coverage_script.instances(runs)
    rng = random.Random(7)
    both = coverage_script.coverage(pooled, 2, 50, rng)
    assert (both.entries, both.mean, both.lowest) == (3, 3, 3)
    one = coverage_script.coverage(pooled, 1, 200, rng)
    assert 1.0 < one.mean < 2.0 and one.lowest < 3
    assert coverage_script.figures([((1.0, 0.8),), ((2.0, 0.8),)]) == pytest.approx(
        (0.8 / 1.5, 0.4, 0.8)
    )
