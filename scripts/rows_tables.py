"""The tables of docs/real-rows.md from ``cpkv bench --rows MODEL --json`` documents: the ops
at the longest history (one run, or several side by side: e.g. an idle run, one next to
``yes > /dev/null`` and a second idle run), how the second run's figures sit in the first's
spreads, with three runs or more the same for every ordered pair (the idle pair is the
yardstick the busy pairs are read against), the chunk projection and slot against unique,
as Markdown.

    .venv/bin/python scripts/rows_tables.py idle.json busy.json idle-again.json \
        --names idle,busy,"idle again" > tables.md
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MIB = 1 << 20


def _span(values: Sequence[float], fmt: str) -> str:
    low, high = min(values), max(values)
    return f"{low:{fmt}}-{high:{fmt}}"


def _ms(values: Sequence[float]) -> str:
    return _span(values, ".2f" if max(values) < 1 else ".1f")


def _keyed(doc: dict[str, Any]) -> dict[tuple[Any, ...], dict[str, Any]]:
    return {
        (e["op"], e["variant"], e["shared_prefix"], e["history"], e["bs"], e["cp_size"]): e
        for e in doc["real_rows"]
    }


def _lowest(entries: Sequence[dict[str, Any]]) -> str:
    low = min(entries, key=lambda e: e["ratio_to_copy"])
    noisy = " noisy" if low["noisy"] else ""
    return f"{low['ratio_to_copy']:.2f} ({low['ratio_low']:.2f}-{low['ratio_high']:.2f}){noisy}"


def ops_table(docs: Sequence[dict[str, Any]], names: Sequence[str]) -> str:
    """Every op at the longest history: bytes and times of the first run, then each run's
    lowest ratio with that entry's spread and the median ratio."""
    first = docs[0]
    longest = max(e["history"] for e in first["real_rows"])
    groups: dict[tuple[str, str, bool], list[dict[str, Any]]] = {}
    for e in first["real_rows"]:
        if e["history"] == longest:
            groups.setdefault((e["op"], e["variant"], e["shared_prefix"]), []).append(e)
    head = ["op / variant", "shared prefix", "MiB a layer", "ms a layer"]
    for name in names:
        head += [f"{name}: lowest (its spread)", f"{name}: median"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for (op, variant, shared), entries in groups.items():
        cells = [
            f"`{op}/{variant}`",
            "yes" if shared else "",
            _span([e["bytes"] / MIB for e in entries], ".1f"),
            _ms([e["seconds"] * 1e3 for e in entries]),
        ]
        for doc in docs:
            same = [
                e
                for e in doc["real_rows"]
                if (e["op"], e["variant"], e["shared_prefix"], e["history"])
                == (op, variant, shared, longest)
            ]
            median = statistics.median(e["ratio_to_copy"] for e in same)
            cells += [_lowest(same), f"{median:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Agreement:
    """How a second run's entries at the longest history sit against a first run's."""

    longest: int
    keys: list[tuple[Any, ...]]
    inside: list[tuple[Any, ...]]
    """Entries whose second ratio lies inside the first run's spread."""
    overlap: int
    """Entries whose two spreads overlap."""
    moves: dict[tuple[Any, ...], float]
    """Each entry's second ratio over its first, less one."""


def compare(first: dict[str, Any], second: dict[str, Any]) -> Agreement:
    """The second run's entries at the longest history against the first's spreads."""
    longest = max(e["history"] for e in first["real_rows"])
    a, b = _keyed(first), _keyed(second)
    keys = [k for k in a if k[3] == longest and k in b]
    inside = [k for k in keys if a[k]["ratio_low"] <= b[k]["ratio_to_copy"] <= a[k]["ratio_high"]]
    return Agreement(
        longest=longest,
        keys=keys,
        inside=inside,
        overlap=sum(
            b[k]["ratio_low"] <= a[k]["ratio_high"] and a[k]["ratio_low"] <= b[k]["ratio_high"]
            for k in keys
        ),
        moves={k: b[k]["ratio_to_copy"] / a[k]["ratio_to_copy"] - 1 for k in keys},
    )


def agreement(idle: dict[str, Any], busy: dict[str, Any]) -> str:
    """How the second run's entries at the longest history sit against the first's."""
    got = compare(idle, busy)
    a, b = _keyed(idle), _keyed(busy)
    worst = max(got.keys, key=lambda k: abs(got.moves[k]))
    outside = [
        f"{_name(k)}: {b[k]['ratio_to_copy']:.2f} against {a[k]['ratio_low']:.2f}-"
        f"{a[k]['ratio_high']:.2f}"
        for k in got.keys
        if k not in got.inside
    ]
    return (
        f"{len(got.keys)} entries at {got.longest}: {len(got.inside)} with the second run's "
        f"ratio inside the first's spread, {got.overlap} whose spreads overlap; the ratio moved "
        f"by {statistics.median(abs(s) for s in got.moves.values()):.1%} (median), at most "
        f"{abs(got.moves[worst]):.1%} ({_name(worst)}: {a[worst]['ratio_to_copy']:.2f} "
        f"-> {b[worst]['ratio_to_copy']:.2f}). Outside: {'; '.join(outside) or 'none'}"
    )


def agreement_table(docs: Sequence[dict[str, Any]], names: Sequence[str]) -> str:
    """Every ordered pair of runs: how many of one run's figures at the longest history lie
    inside the other's spreads, how many spreads overlap, and how far the figures moved. A
    pair of idle runs is the yardstick a pair of an idle and a busy run is read against."""
    head = ["spreads of", "figures of", "inside", "spreads overlap", "moved (median)", "at most"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for i, first in enumerate(docs):
        for j, second in enumerate(docs):
            if i == j:
                continue
            got = compare(first, second)
            moves = [abs(m) for m in got.moves.values()]
            cells = [
                names[i],
                names[j],
                f"{len(got.inside)} of {len(got.keys)}",
                f"{got.overlap} of {len(got.keys)}",
                f"{statistics.median(moves):.1%}",
                f"{max(moves):.1%}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _name(key: tuple[Any, ...]) -> str:
    """``op/variant bs B cp C [shared]`` of a ``_keyed`` key."""
    return f"{key[0]}/{key[1]} bs {key[4]} cp {key[5]}{' shared' if key[2] else ''}"


def summary(doc: dict[str, Any], name: str) -> str:
    """One run in a line: its wall time, its lowest entry at the longest history, noisy."""
    setup = doc["real_rows_setup"]
    longest = max(e["history"] for e in doc["real_rows"])
    at = [e for e in doc["real_rows"] if e["history"] == longest]
    low = min(at, key=lambda e: e["ratio_to_copy"])
    reach = sum(e["ratio_to_copy"] >= setup["goal_ratio_to_copy"] for e in at)
    large = [e["bytes"] / e["copy_seconds"] / 1e9 for e in doc["real_rows"] if e["bytes"] > 50e6]
    buffers = setup.get("copy_buffer_bytes")  # NOTE: absent from runs before the ceiling's sizing
    ceiling = f"{buffers >> 20} MiB buffers, " if buffers else ""
    copy = f"{statistics.median(large):.2f} GB/s" if large else "no op above 50 MB"
    return (
        f"{name}: {setup['seconds']:.0f} s in the grid, {setup['torch_threads']} thread(s), "
        f"{setup['clock']} clock; {reach} of {len(at)} at {longest} reach "
        f"{setup['goal_ratio_to_copy']}; lowest {low['op']}/{low['variant']} bs {low['bs']} "
        f"cp {low['cp_size']}{' shared' if low['shared_prefix'] else ''}: "
        f"{low['ratio_to_copy']:.2f} ({low['ratio_low']:.2f}-{low['ratio_high']:.2f}); "
        f"noisy {setup['noisy']} of {len(doc['real_rows'])} entries; the copy ({ceiling}"
        f"median over the ops above 50 MB): {copy}"
    )


def projection_table(doc: dict[str, Any]) -> str:
    """One chunk over every layer at the longest history: level 0 and what each adds."""
    rows = doc["real_rows_projection"]
    longest = max(r["history"] for r in rows)
    head = ["bs", "cp", "level 0 (s)", "level 1", "levels 2-4, unique", "level 5, unique"]
    head += ["level 5, slot", "level 5, peer-read"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    at = {
        (r["bs"], r["cp_size"], r["read"], r["level"]): r for r in rows if r["history"] == longest
    }
    for bs, cp in sorted({(k[0], k[1]) for k in at}):
        cells = [str(bs), str(cp), f"{at[(bs, cp, 'unique', 0)]['seconds']:.2f}"]
        for read, level in (("unique", 1), ("unique", 2), ("unique", 5), ("slot", 5)):
            cells.append(f"{at[(bs, cp, read, level)]['seconds_vs_level0']:+.2f}")
        cells.append(f"{at[(bs, cp, 'peer-read', 5)]['seconds_vs_level0']:+.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def remap_table(doc: dict[str, Any]) -> str:
    """Slot against unique at the longest history and the largest batch, per chunk."""
    rows = doc["slot_vs_unique"]
    longest, bs = max(r["history"] for r in rows), max(r["bs"] for r in rows)
    head = [f"bs {bs}, history", "cp", "prefix", "read", "GB slot / unique", "s slot / unique"]
    head += ["scratch MiB slot / unique", "host plan ms slot / unique", "winner"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in sorted(rows, key=lambda r: (r["cp_size"], r["shared_prefix"], r["read"][0] != "p")):
        if (r["history"], r["bs"]) != (longest, bs):
            continue
        cells = [
            str(longest),
            str(r["cp_size"]),
            "shared" if r["shared_prefix"] else "own",
            r["read"],
            f"{r['slot_bytes'] / 1e9:.1f} / {r['unique_bytes'] / 1e9:.1f}",
            f"{r['slot_seconds']:.1f} / {r['unique_seconds']:.1f}",
            f"{r['slot_scratch_bytes'] / MIB:.0f} / {r['unique_scratch_bytes'] / MIB:.0f}",
            f"{r['slot_plan_seconds'] * 1e3:.0f} / {r['unique_plan_seconds'] * 1e3:.0f}",
            r["winner"],
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="JSON documents; the first gives bytes and times")
    parser.add_argument("--names", default="idle,busy", help="a name per run, comma-separated")
    args = parser.parse_args()
    docs = []
    for path in args.runs:
        with open(path) as f:
            docs.append(json.load(f))
    names = args.names.split(",")[: len(docs)]
    for doc, name in zip(docs, names, strict=True):
        print(summary(doc, name), end="\n\n")
    print(ops_table(docs, names), end="\n\n")
    if len(docs) > 1:
        print(agreement(docs[0], docs[1]), end="\n\n")
    if len(docs) > 2:
        print(agreement_table(docs, names), end="\n\n")
    print(projection_table(docs[0]), end="\n\n")
    print(remap_table(docs[0]))


if __name__ == "__main__":
    main()
