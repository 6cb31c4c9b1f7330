"""Workload synthesis: page keys, the radix cache, the SGLang-like scheduler, the shapes and
presets, and the traces they make."""

from __future__ import annotations

import pytest

from cpkv.synth import (
    PRESETS,
    GspShape,
    RandomShape,
    SchedulerConfig,
    Session,
    Turn,
    Workload,
    generated_shared_prefix,
    random_prompts,
    schedule,
    summarize,
    trace_text,
)
from cpkv.synth.radix import PageRadixTree
from cpkv.synth.workload import page_keys
from cpkv_core.planning.batch import BatchSpec
from cpkv_core.traces.trace import parse_trace_text

PAGE = 64


def one_turn(rid: str, *segments: tuple[str, int]) -> Session:
    return Session((Turn(rid, segments),))


def run(*sessions: Session, concurrency: int | None = None, **config: int) -> list[BatchSpec]:
    batches = schedule(Workload("test", sessions, concurrency), SchedulerConfig(**config))
    parse_trace_text(trace_text(batches), config.get("page_size", PAGE))  # a valid trace
    return list(batches)


def rows(batches: list[BatchSpec]) -> list[list[tuple[str, int, int, str | None]]]:
    """Per batch: (rid, prefix_len, extend_len, prefix_from) of each request."""
    return [
        [(r.rid, r.prefix_len, r.extend_len, r.prefix_from) for r in b.requests] for b in batches
    ]


def test_page_keys_are_equal_only_for_the_same_content_at_the_same_place() -> None:
    a = page_keys([("sys", 100), ("qa", 60)], 64)
    b = page_keys([("sys", 100), ("qb", 60)], 64)
    assert len(a) == 2  # 160 tokens: two full pages, the third is partly filled
    assert a[0] == b[0] == (("sys", 0, 64),)
    assert a[1] == (("sys", 64, 100), ("qa", 0, 28)) != b[1]


def test_radix_match_stops_at_the_first_uncached_page_and_names_its_writer() -> None:
    tree = PageRadixTree()
    keys = page_keys([("doc", 640)], 64)
    tree.insert("a", keys[:4])
    tree.insert("b", keys[:6])  # pages 0..3 keep writer a; b writes pages 4 and 5
    assert tree.match(keys, 10) == (6, "b")
    assert tree.match(keys[:3], 10) == (3, "a")
    assert tree.match(keys, 2) == (2, "a")
    assert tree.match(page_keys([("other", 640)], 64), 10) == (0, None)


def test_chunked_prefill_cuts_a_long_prompt_into_chunk_sized_pieces() -> None:
    batches = run(one_turn("a", ("a", 600)), chunked_prefill_size=256, max_prefill_tokens=1024)
    assert rows(batches) == [
        [("a", 0, 256, None)],
        [("a", 256, 256, None)],
        [("a", 512, 88, None)],
    ]


def test_a_chunk_size_off_the_page_grid_makes_the_next_chunk_resume_mid_page() -> None:
    # NOTE: SGLang cuts a new request to whole pages (100 // 64 * 64 = 64) but continues a
    # chunked one by the full chunk size (100 tokens), not rounded to pages.
    batches = run(one_turn("a", ("a", 300)), chunked_prefill_size=100, max_prefill_tokens=1024)
    assert [r[0][1:3] for r in rows(batches)] == [(0, 64), (64, 100), (164, 100), (264, 36)]
    assert summarize(batches, PAGE).mid_page_resumes == 2


def test_a_request_reaching_the_batch_budget_waits_unless_it_is_first() -> None:
    batches = run(
        one_turn("a", ("a", 500)),
        one_turn("b", ("b", 600)),
        chunked_prefill_size=-1,
        max_prefill_tokens=1024,
    )
    # NOTE: b's 640 paged tokens reach the 1024 - 512 left after a, so b waits.
    assert rows(batches) == [[("a", 0, 500, None)], [("b", 0, 600, None)]]


def test_requests_fill_a_batch_then_the_last_one_is_cut_to_whole_pages() -> None:
    batches = run(
        one_turn("a", ("a", 300)),
        one_turn("b", ("b", 300)),
        chunked_prefill_size=512,
        max_prefill_tokens=4096,
    )
    # NOTE: a is charged 320 (whole pages); 192 of the chunk budget are left for b.
    assert rows(batches) == [[("a", 0, 300, None), ("b", 0, 192, None)], [("b", 192, 108, None)]]


def test_a_prefix_computed_in_the_same_batch_is_not_a_hit_but_later_batches_hit_it() -> None:
    system = ("sys", 300)
    batches = run(
        one_turn("a", system, ("qa", 20)),
        one_turn("b", system, ("qb", 20)),
        one_turn("c", system, ("qc", 20)),
        chunked_prefill_size=700,
        max_prefill_tokens=4096,
    )
    assert rows(batches) == [
        [("a", 0, 320, None), ("b", 0, 320, None)],
        [("c", 256, 64, "a")],  # 4 whole pages of the system prompt, written by a
    ]


def test_a_full_hit_still_leaves_one_token_to_compute() -> None:
    prompt = ("same", 256)
    batches = run(one_turn("a", prompt), one_turn("b", prompt), concurrency=1)
    assert rows(batches)[1] == [("b", 192, 64, "a")]


def test_a_session_turn_waits_for_its_previous_turn_and_hits_its_pages() -> None:
    first = Turn("t0", (("doc", 700), ("q0", 30)))
    second = Turn("t1", (("doc", 700), ("q1", 30)))
    batches = run(Session((first, second)), chunked_prefill_size=512, max_prefill_tokens=4096)
    assert rows(batches) == [
        [("t0", 0, 512, None)],
        [("t0", 512, 218, None)],
        [("t1", 640, 90, "t0")],
    ]


def test_max_concurrency_admits_the_next_session_only_when_one_finishes() -> None:
    sessions = [one_turn(f"r{i}", (f"r{i}", 100)) for i in range(3)]
    batches = run(*sessions, concurrency=2, chunked_prefill_size=8192, max_prefill_tokens=8192)
    assert rows(batches) == [
        [("r0", 0, 100, None), ("r1", 0, 100, None)],
        [("r2", 0, 100, None)],
    ]


@pytest.mark.parametrize(
    "config", [{"chunked_prefill_size": 32}, {"page_size": 0}, {"max_prefill_tokens": 0}]
)
def test_rejects_scheduler_settings_that_cannot_build_a_batch(config: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="must be"):
        run(one_turn("a", ("a", 10)), **config)


def test_generated_shared_prefix_has_groups_of_prompts_sharing_a_system_prompt() -> None:
    shape = GspShape(num_groups=3, prompts_per_group=4, system_prompt_len=200, question_len=50)
    workload = generated_shared_prefix(shape, seed=7)
    turns = [s.turns[0] for s in workload.sessions]
    assert len(turns) == 12
    assert {t.segments[0] for t in turns} == {("sys0", 200), ("sys1", 200), ("sys2", 200)}
    assert all(t.prompt_len == 250 for t in turns)
    assert [t.rid for t in turns] != sorted(t.rid for t in turns)  # shuffled, as bench_serving


def test_random_prompts_draw_lengths_between_the_ratio_and_the_input_len() -> None:
    workload = random_prompts(RandomShape(num_prompts=200, input_len=1000, range_ratio=0.5), 3)
    lengths = [s.turns[0].prompt_len for s in workload.sessions]
    assert min(lengths) >= 500 and max(lengths) <= 1000 and len(set(lengths)) > 50


@pytest.mark.parametrize("key", sorted(PRESETS))
def test_every_preset_computes_each_turn_once_up_to_its_whole_prompt(key: tuple[str, str]) -> None:
    preset = PRESETS[key]
    workload = preset.make(1)
    batches = schedule(workload, preset.scheduler)
    parse_trace_text(trace_text(batches), PAGE)
    prompts = {t.rid: t.prompt_len for s in workload.sessions for t in s.turns}
    reached: dict[str, int] = {}
    for batch in batches:
        assert batch.num_tokens <= preset.scheduler.max_prefill_tokens
        for req in batch.requests:
            assert reached.get(req.rid, req.prefix_len) == req.prefix_len
            reached[req.rid] = req.seq_len
    assert reached == prompts


@pytest.mark.parametrize("key", sorted(PRESETS))
def test_a_preset_gives_the_same_bytes_for_a_seed_and_others_for_another(
    key: tuple[str, str],
) -> None:
    preset = PRESETS[key]

    def text(seed: int) -> str:
        return trace_text(schedule(preset.make(seed), preset.scheduler))

    assert text(1) == text(1)
    assert text(1) != text(2)


def test_presets_have_their_shape_prefix_hits_and_chunking() -> None:
    figures = {key: summarize(schedule(p.make(1), p.scheduler), PAGE) for key, p in PRESETS.items()}
    for summary in figures.values():
        assert summary.cached_tokens > 0 and summary.continued_chunks > 0
    long_doc = figures[("long-doc", "full")]
    assert long_doc.prompt_tokens / long_doc.requests > 32768
    assert figures[("chat", "full")].cached_tokens / figures[("chat", "full")].prompt_tokens > 0.5
