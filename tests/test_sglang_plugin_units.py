"""The plugin's parts that need no SGLang: import hygiene, which hooks the settings need, where
each last token lives after SGLang's split, the decision records, the landing check and the
gate's view of a batch. (SGLang's own code runs in ``test_sglang_plugin*.py``.)"""

from __future__ import annotations

import os
import subprocess
import sys
import types
from itertools import accumulate
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cpkv_core.config import CpMode, DeploymentConfig
from cpkv_core.planning import BatchSpec, RequestSpec, Scheduler
from cpkv_sglang.batch_view import scheduled_view
from cpkv_sglang.last_rows import interleave_places, zigzag_places
from cpkv_sglang.plugin import groups_for
from cpkv_sglang.records import Totals, record_of
from cpkv_sglang.targets import HOOKS, Hook, HookGroup, Site, unlanded
from flags import FlagSet
from phases import Gate, PhaseId


def test_importing_the_plugin_package_imports_neither_sglang_nor_torch() -> None:
    code = "import sys, cpkv_sglang; print(sorted({'sglang', 'torch'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("settings", "groups"),
    [
        ({}, set()),
        ({"shadow_rate": 0.5}, set()),
        ({"enable_nsa_prefill_cp_narrow_output": True}, set(HookGroup)),
        ({"nsa_prefill_cp_min_tokens": 512}, {HookGroup.STARTUP, HookGroup.GATE}),
        ({"enable_nsa_prefill_cp_shared_kv": True}, {HookGroup.STARTUP}),
    ],
)
def test_installs_only_the_hooks_of_what_is_on(
    settings: dict[str, object], groups: set[HookGroup]
) -> None:
    assert groups_for(FlagSet(**settings)) == groups  # type: ignore[arg-type]


def zigzag_metadata(extend_lens: list[int], cp: int, rank: int) -> tuple[list[int], list[int]]:
    """``split_list`` and ``zigzag_index`` as ``ZigzagCPStrategy.build_metadata`` makes them."""
    segments = 2 * cp
    split = [
        length // segments + (block < length % segments)
        for length in extend_lens
        for block in range(segments)
    ]
    bs = len(extend_lens)
    index = [rank + k * segments for k in range(bs)] + [
        segments - 1 - rank + k * segments for k in range(bs)
    ]
    return split, index


def local_tokens(split: list[int], index: list[int]) -> list[int]:
    """Batch token positions of a rank's local rows, chunk by chunk."""
    starts = [0, *accumulate(split)]
    return [t for chunk in index for t in range(starts[chunk], starts[chunk + 1])]


@given(st.lists(st.integers(8, 60), min_size=1, max_size=6), st.integers(2, 4))
def test_zigzag_places_each_last_token_on_the_rank_and_row_that_hold_it(
    lens: list[int], cp: int
) -> None:
    last = [end - 1 for end in accumulate(lens)]
    holder = {}
    for rank in range(cp):
        split, index = zigzag_metadata(lens, cp, rank)
        places = zigzag_places(split, index, cp, rank)
        local = local_tokens(split, index)
        holder |= {i: rank for i, t in enumerate(last) if t in local}
        assert places.mine == tuple(i for i, t in enumerate(last) if t in local)
        assert [local[row] for row in places.local_rows] == [last[i] for i in places.mine]
        assert places.owners == tuple(holder.get(i, places.owners[i]) for i in range(len(lens)))
    assert places.owners == tuple(holder[i] for i in range(len(lens)))


@given(st.lists(st.integers(1, 60), min_size=1, max_size=6), st.integers(2, 4))
def test_interleave_places_token_t_on_rank_t_mod_cp_at_row_t_div_cp(
    lens: list[int], cp: int
) -> None:
    last = [end - 1 for end in accumulate(lens)]
    for rank in range(cp):
        local = list(range(rank, sum(lens), cp))
        places = interleave_places(lens, cp, rank)
        assert places.mine == tuple(i for i, t in enumerate(last) if t in local)
        assert [local[r] for r in places.local_rows] == [last[i] for i in places.mine]


def deploy(cp_min: int = 0) -> DeploymentConfig:
    return DeploymentConfig(
        cp_size=4, cp_mode=CpMode.ROUND_ROBIN_SPLIT, page_size=4, cp_min_tokens=cp_min
    )


def test_a_record_names_cp_off_and_every_reason_of_an_enabled_inactive_phase() -> None:
    gate = Gate(frozenset({PhaseId.NARROW_OUTPUT}), deploy(cp_min=100))
    spec = BatchSpec(3, (RequestSpec("a", 0, 40, return_logprob=True), RequestSpec("b", 8, 20)))
    record = record_of(3, 60, 2, True, gate.decide(scheduled_view(spec, 4, 4)))
    assert (record.split, record.phase) == (False, 0)
    assert record.reasons == ("CP_OFF tokens=60 min=100",)
    plan = Gate(frozenset({PhaseId.NARROW_OUTPUT}), deploy()).decide(scheduled_view(spec, 4, 4))
    record = record_of(4, 60, 2, True, plan)
    assert record.reasons == ("1:RETURN_LOGPROB rid=a",)
    totals = Totals()
    totals.count(record)
    totals.tail["stock"] += 1
    assert totals.line() == (
        "cpkv totals: 1 batches; phase 0: 1; reasons: 1:RETURN_LOGPROB 1; tail: stock 1; shadow: -"
    )


def test_the_gate_decides_the_view_as_it_decides_cpkvs_own_schedule() -> None:
    gate = Gate(frozenset({PhaseId.NARROW_OUTPUT}), deploy(cp_min=50))
    for lens in ([3], [40, 5], [30, 30], [1, 2, 3, 60]):
        spec = BatchSpec(0, tuple(RequestSpec(f"r{i}", 0, n) for i, n in enumerate(lens)))
        own = Scheduler(64, 4, 4).schedule(spec)
        view = scheduled_view(spec, 4, 4)
        assert gate.decide(view) == gate.decide(own)
        assert (view.extend_lens, view.current_pages) == (own.extend_lens, own.current_pages)
        assert len(view.new_pages) == len(own.new_pages)


def _original(x: int) -> int:
    return x


def _wrapper(x: int) -> int:
    return x


def test_a_wrapper_counts_as_landed_only_where_its_wrapped_chain_reaches_the_original(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _wrapper.__wrapped__ = _original  # type: ignore[attr-defined]
    source = types.ModuleType("cpkv_fake_source")
    caller = types.ModuleType("cpkv_fake_caller")
    source.fn, caller.fn = _wrapper, _original
    monkeypatch.setitem(sys.modules, source.__name__, source)
    monkeypatch.setitem(sys.modules, caller.__name__, caller)
    sites = (Site(caller.__name__, "fn"), Site("cpkv_not_loaded", "fn"))
    hook = Hook(f"{source.__name__}.fn", "AROUND", "x:y", "f.py", HookGroup.TAIL, "", sites)
    originals = {hook.target: _original}
    stale = unlanded((hook,), originals)
    assert len(stale) == 1 and stale[0].startswith("cpkv_fake_caller.fn (still "), stale
    caller.fn = _wrapper
    assert unlanded((hook,), originals) == [], "a module not loaded yet binds the wrapper later"
    source.fn = _original
    stale = unlanded((hook,), originals)
    assert len(stale) == 1 and stale[0].startswith("cpkv_fake_source.fn (still "), stale


def test_every_hook_names_a_file_of_the_wheel_and_an_implementation() -> None:
    for hook in HOOKS:
        module, _, name = hook.hook.partition(":")
        assert hook.file.startswith("sglang/srt/") and hook.kind in ("AROUND", "AFTER")
        assert module.startswith("cpkv_sglang.") and name.startswith(("around_", "after_"))


def test_the_bench_reads_the_result_line_the_plugins_bench_writes() -> None:
    from cpkv.bench.sglang_plugin import MARKER as READ
    from cpkv_sglang.cpu.bench import MARKER as WRITTEN

    assert READ == WRITTEN


def test_the_plugin_page_names_every_hook_target_with_its_file_in_the_wheel() -> None:
    page = (Path(__file__).parents[1] / "docs" / "sglang-plugin.md").read_text()
    for hook in HOOKS:
        row = f"| `{hook.target.removeprefix('sglang.srt.')}` | {hook.kind} | `{hook.file}` |"
        assert row in page, hook.target


def test_sglangs_kv_sharding_is_reported_as_phase_2_and_its_nixl_backend_not_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from cpkv_sglang.report import phase_lines, plugin_refusals, startup_line
    from cpkv_sglang.startup import _split_phase_2
    from flags import check_flags
    from flags.sglang.server_args import read_server_args

    for name in [n for n in os.environ if n.startswith("CPKV_")]:
        monkeypatch.delenv(name)
    (tmp_path / "cpkv.toml").write_text("")
    monkeypatch.setenv("CPKV_CONFIG", str(tmp_path / "cpkv.toml"))
    monkeypatch.setenv("CPKV_ENABLE_NSA_PREFILL_CP_NARROW_OUTPUT", "1")
    values = {
        "enable_prefill_cp": True,
        "cp_strategy": "interleave",
        "attn_cp_size": 8,
        "page_size": 64,
        "enable_kv_cache_sharding": True,
        "disaggregation_mode": "prefill",
        "disaggregation_transfer_backend": "nixl",
    }
    flags = read_server_args(values)
    kept, notes = _split_phase_2(check_flags(flags.flags))
    assert kept == [] and len(notes) == 1 and "phase=2" in notes[0]
    assert plugin_refusals(flags.flags, flags) == []
    assert "phases on: 1 (narrow output), 2 (SGLang's KV sharding); cp 8 round-robin-split" in (
        startup_line(HOOKS, flags)
    )
    assert phase_lines(flags)[1].startswith("phase 2 sharded KV: on: SGLang's own")
