"""The shape of the code, measured from its own imports: no import circle, a shallow app, small
modules and a thin ``cli.py``.

Every import counts: module-level, function-level and ``TYPE_CHECKING`` ones (grimp, which
import-linter runs on, reads them all). A package's ``__init__`` is a module of its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cpkv", "cpkv_sglang", "flags", "phases", "cpkv_core")
MAX_APP_CHAIN = 9
"""Modules in the longest import chain inside ``cpkv/`` (it was 12 before the app was split
into commands over services)."""
MAX_MODULE_LINES = 320
"""Lines of the largest module of a package or script (one job per module)."""
MAX_CLI_LINES = 199
"""``cli.py`` holds the app, its registrations and ``main`` only."""

Graph = Mapping[str, set[str]]


@pytest.fixture(scope="module")
def graph() -> Graph:
    """Every module of the four packages and the modules of the four it imports."""
    imports = grimp.build_graph(*PACKAGES, cache_dir=None)
    return {m: set(imports.find_modules_directly_imported_by(m)) for m in imports.modules}


def import_circles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module (or a module importing
    itself), each sorted: every import circle lies inside one (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    circles.append(sorted(component))
    return circles


def longest_chain(graph: Graph, package: str) -> list[str]:
    """The longest import chain between modules of ``package``; an import back into the
    chain being followed (a circle, which its own test reports) is not followed."""
    inside = {m for m in graph if m == package or m.startswith(f"{package}.")}
    longest: dict[str, list[str]] = {}
    following: set[str] = set()

    def chain_from(module: str) -> list[str]:
        if module not in longest:
            following.add(module)
            targets = sorted(graph[module] & inside - following)
            tails = [chain_from(t) for t in targets]
            longest[module] = [module, *max(tails, key=len, default=[])]
            following.discard(module)
        return longest[module]

    return max((chain_from(m) for m in sorted(inside)), key=len)


def oversized(paths: Iterable[Path], limit: int) -> dict[str, int]:
    """Each file of ``paths`` with more than ``limit`` lines, and its lines."""
    sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines()) for p in paths}
    return {name: lines for name, lines in sorted(sizes.items()) if lines > limit}


def test_no_import_circle_anywhere(graph: Graph) -> None:
    assert import_circles(graph) == []


def test_the_app_is_at_most_nine_modules_deep(graph: Graph) -> None:
    chain = longest_chain(graph, "cpkv")
    assert len(chain) <= MAX_APP_CHAIN, " -> ".join(chain)


def test_no_package_module_or_script_is_over_320_lines() -> None:
    files = [p for package in PACKAGES for p in (ROOT / package).rglob("*.py")]
    files += list((ROOT / "scripts").glob("*.py"))
    assert oversized(files, MAX_MODULE_LINES) == {}


def test_cli_holds_only_the_app_and_its_registrations() -> None:
    assert oversized([ROOT / "cpkv" / "cli.py"], MAX_CLI_LINES) == {}


def test_the_measures_find_what_they_look_for() -> None:
    """On a small graph: a circle through a TYPE_CHECKING-style back edge, and the chain."""
    graph = {"a": {"a.b"}, "a.b": {"a.c"}, "a.c": {"a.b", "x"}, "x": set(), "a.d": {"a"}}
    assert import_circles(graph) == [["a.b", "a.c"]]
    assert import_circles({"a": {"a"}}) == [["a"]]
    acyclic = {"a": {"a.b"}, "a.b": {"a.c", "x"}, "a.c": set(), "x": set(), "a.d": {"a"}}
    assert longest_chain(acyclic, "a") == ["a.d", "a", "a.b", "a.c"]
