"""How many passes over the grid a ``cpkv bench --rows`` run needs for the next run's figures
to fall inside its spreads, estimated from runs already made.

Each entry of a run pools the rounds of its passes, one instance of the op's buffers a pass
(``placement_rounds`` in the JSON). Where the buffers land moves an op's time by more than
its rounds at one instance spread, so how often a second run's ratio falls inside a first
run's spread depends on how many instances each run samples. This script pools every
instance of every entry at the longest history over the runs given, draws two runs of
``P`` instances each, without replacement where there are enough, and counts the entries
whose second ratio lies inside the first's spread, over many draws, for each ``P``.

It treats the instances as interchangeable: those of an idle run and of one next to
``yes > /dev/null`` alike. Within one run that holds; across runs it does not: three runs at
nine passes each, which the pooled draw predicts to agree on all 96 entries, put 85-95 of
each other's ratios inside their spreads (docs/real-rows.md). So what this script measures
is the effect of the buffers' placement inside a run, a bound on what more passes can buy,
not a forecast of the next run.

    .venv/bin/python scripts/rows_coverage.py rows-*.json --passes 1,3,5,9
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

Key = tuple[Any, ...]
Round = tuple[float, float]
"""(op seconds, copy seconds) of one round."""
Instance = tuple[Round, ...]
"""The rounds taken at one instance of an op's buffers."""


@dataclass(frozen=True, slots=True)
class Coverage:
    """Entries inside the first run's spreads over the draws, for one number of passes."""

    passes: int
    entries: int
    mean: float
    p10: int
    lowest: int


def instances(
    docs: Iterable[dict[str, Any]], rounds_each: int | None = None
) -> dict[Key, list[Instance]]:
    """Every instance of every entry at the longest history of each run, by entry; with
    ``rounds_each``, only each instance's first rounds (what fewer rounds a pass would
    have taken)."""
    pooled: dict[Key, list[Instance]] = {}
    for doc in docs:
        longest = max(e["history"] for e in doc["real_rows"])
        for e in doc["real_rows"]:
            if e["history"] != longest:
                continue
            if "placement_rounds" not in e:
                raise ValueError("a run without placement_rounds: it predates this script")
            rounds = list(zip(e["op_rounds"], e["copy_rounds"], strict=True))
            key = (e["op"], e["variant"], e["shared_prefix"], e["history"], e["bs"], e["cp_size"])
            start = 0
            for count in e["placement_rounds"]:
                taken = rounds[start : start + count][:rounds_each]
                pooled.setdefault(key, []).append(tuple(taken))
                start += count
    return pooled


def figures(sample: Sequence[Instance]) -> tuple[float, float, float]:
    """(ratio of medians, lowest, highest per-round ratio) of one run's instances pooled, as
    ``Timing`` reads them."""
    rounds = [r for instance in sample for r in instance]
    ratio = statistics.median(c for _, c in rounds) / statistics.median(o for o, _ in rounds)
    per_round = [c / o for o, c in rounds]
    return ratio, min(per_round), max(per_round)


def _draw(pool: list[Instance], passes: int, rng: random.Random) -> list[Instance]:
    if len(pool) >= passes:
        return rng.sample(pool, passes)
    return rng.choices(pool, k=passes)


def coverage(
    pooled: dict[Key, list[Instance]], passes: int, draws: int, rng: random.Random
) -> Coverage:
    """Two runs of ``passes`` instances each, ``draws`` times over."""
    counts = []
    for _ in range(draws):
        inside = 0
        for pool in pooled.values():
            _, low, high = figures(_draw(pool, passes, rng))
            ratio, _, _ = figures(_draw(pool, passes, rng))
            inside += low <= ratio <= high
        counts.append(inside)
    counts.sort()
    return Coverage(
        passes, len(pooled), statistics.mean(counts), counts[len(counts) // 10], counts[0]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="cpkv bench --rows MODEL --json documents")
    parser.add_argument("--passes", default="1,2,3,4,5,6,7,9", help="comma-separated")
    parser.add_argument(
        "--rounds", type=int, default=None, help="keep only each instance's first N rounds"
    )
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    docs = []
    for path in args.runs:
        with open(path) as f:
            docs.append(json.load(f))
    pooled = instances(docs, args.rounds)
    counts = sorted(len(v) for v in pooled.values())
    print(f"{len(pooled)} entries, {counts[0]}-{counts[-1]} instances each, {len(docs)} runs")
    print("| passes a run | inside the other run's spreads: mean | 1 draw in 10 below | lowest |")
    print("| --- | --- | --- | --- |")
    rng = random.Random(args.seed)
    for passes in (int(p) for p in args.passes.split(",")):
        c = coverage(pooled, passes, args.draws, rng)
        print(f"| {c.passes} | {c.mean:.1f} of {c.entries} | {c.p10} | {c.lowest} |")


if __name__ == "__main__":
    main()
