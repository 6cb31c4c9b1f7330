"""Trace format: strict per-line schema, whole-trace rules, errors naming line and field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cpkv_core.planning.batch import BatchSpec, RequestSpec
from cpkv_core.traces.trace import (
    Trace,
    TraceError,
    load_trace,
    parse_trace_lines,
    parse_trace_text,
    validate_trace,
)

PAGE = 64


def req(
    rid: object = "a", prefix_len: object = 0, extend_len: object = 300, **extra: Any
) -> dict[str, Any]:
    """One request of a trace line, as JSON-ready data."""
    return {"rid": rid, "prefix_len": prefix_len, "extend_len": extend_len, **extra}


def line(batch: int, *requests: dict[str, Any], **extra: Any) -> str:
    """One trace line."""
    return json.dumps({"batch": batch, "requests": list(requests) or [req()], **extra})


def text(*lines: str) -> str:
    return "\n".join(lines) + "\n"


def trace_error(source_text: str, page_size: int = PAGE) -> TraceError:
    with pytest.raises(TraceError) as info:
        parse_trace_text(source_text, page_size, source="trace.jsonl")
    return info.value


GOOD = text(
    line(0, req("a", 0, 300)),
    "",
    line(
        1, req("a", 300, 100), req("b", 256, 40, prefix_from="a", return_logprob=True), spec="EAGLE"
    ),
    "   ",
    line(2, req("b", 296, 1, capture_hidden=True)),
)


# -- good traces -------------------------------------------------------------------------


def test_parses_good_trace_with_blank_lines() -> None:
    trace = parse_trace_text(GOOD, PAGE, source="good.jsonl")
    assert trace == Trace(
        source="good.jsonl",
        batches=(
            BatchSpec(0, (RequestSpec("a", 0, 300),)),
            BatchSpec(
                1,
                (
                    RequestSpec("a", 300, 100),
                    RequestSpec("b", 256, 40, prefix_from="a", return_logprob=True),
                ),
                spec="EAGLE",
            ),
            BatchSpec(2, (RequestSpec("b", 296, 1, capture_hidden=True),)),
        ),
        line_numbers=(1, 3, 5),
    )


def test_parse_trace_lines_returns_batches_without_whole_trace_rules() -> None:
    # prefix_from of an unknown rid is a whole-trace error, not a schema error.
    batches = parse_trace_lines([line(0, req("b", 64, 1, prefix_from="zzz"))])
    assert batches == (BatchSpec(0, (RequestSpec("b", 64, 1, prefix_from="zzz"),)),)


def test_load_trace_round_trips_a_file(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(GOOD)
    trace = load_trace(path, PAGE)
    assert trace.source == str(path)
    assert trace.batches == parse_trace_text(GOOD, PAGE).batches
    assert trace.line_numbers == (1, 3, 5)


def test_spec_defaults_to_null_and_flags_default_false() -> None:
    (batch,) = parse_trace_text(json.dumps({"batch": 0, "requests": [req()]}), PAGE).batches
    assert batch.spec is None
    assert batch.requests[0] == RequestSpec("a", 0, 300, None, False, False)


def test_accepts_shared_prefix_equal_to_source_length() -> None:
    parse_trace_text(
        text(line(0, req("a", 0, 128)), line(1, req("b", 128, 5, prefix_from="a"))), PAGE
    )


# -- schema errors -------------------------------------------------------------------------


def test_rejects_missing_field() -> None:
    err = trace_error(
        text(line(0), json.dumps({"batch": 1, "requests": [{"rid": "b", "prefix_len": 0}]}))
    )
    assert (err.line, err.field) == (2, "requests[0].extend_len")
    assert "required" in err.reason


def test_rejects_negative_prefix_len() -> None:
    err = trace_error(text(line(0, req("a", -1, 5))))
    assert (err.line, err.field) == (1, "requests[0].prefix_len")
    assert str(err) == "trace.jsonl:1: requests[0].prefix_len: must be >= 0, got -1"


def test_rejects_zero_extend_len() -> None:
    err = trace_error(text(line(0), "", line(1, req("a", 300, 5), req("b", 0, 0))))
    assert str(err) == "trace.jsonl:3: requests[1].extend_len: must be >= 1, got 0"


def test_rejects_unknown_field_naming_it() -> None:
    err = trace_error(text(line(0, {"rid": "a", "prefx_len": 0, "extend_len": 3})))
    assert (err.line, err.field) == (1, "requests[0].prefx_len")
    with pytest.raises(TraceError, match=r"unknown field.*did you mean 'prefix_len'"):
        raise err


def test_rejects_unknown_top_level_field() -> None:
    err = trace_error(text(line(0, priority=3)))
    assert (err.line, err.field) == (1, "priority")
    assert "unknown field" in err.reason


def test_rejects_invalid_json() -> None:
    err = trace_error(text(line(0), '{"batch": 1, "requests": ['))
    assert (err.line, err.field) == (2, None)
    assert str(err).startswith("trace.jsonl:2: invalid JSON")


def test_rejects_line_that_is_not_an_object() -> None:
    err = trace_error(text("[1, 2]"))
    assert (err.line, err.field) == (1, None)
    assert "JSON object" in err.reason


@pytest.mark.parametrize(
    ("request_data", "field", "words"),
    [
        (req(extend_len=True), "extend_len", "integer, got true"),
        (req(prefix_len=1.0), "prefix_len", "integer, got 1.0"),
        (req(rid=""), "rid", "non-empty string"),
        (req(rid=7), "rid", "string, got 7"),
        (req(return_logprob=1), "return_logprob", "true or false, got 1"),
    ],
)
def test_rejects_wrong_types(request_data: dict[str, Any], field: str, words: str) -> None:
    err = trace_error(text(line(0, request_data)))
    assert err.field == f"requests[0].{field}"
    assert words in err.reason


def test_rejects_empty_requests_and_empty_spec() -> None:
    err = trace_error(json.dumps({"batch": 0, "requests": []}))
    assert (err.field, err.reason) == ("requests", "must be a non-empty list, got an empty list")
    err = trace_error(line(0, spec=""))
    assert err.field == "spec"


@pytest.mark.parametrize("number", [0, -1, 2])
def test_rejects_wrong_batch_number(number: int) -> None:
    err = trace_error(text(line(0), "", line(number, req("a", 300, 1))))
    assert (err.line, err.field) == (3, "batch")
    assert "expected batch 1" in err.reason


def test_rejects_empty_trace() -> None:
    err = trace_error("\n\n")
    assert (err.line, err.field) == (None, None)
    assert "no batches" in str(err)


# -- whole-trace errors ------------------------------------------------------------------


def test_rejects_unknown_prefix_from() -> None:
    err = trace_error(text(line(0), line(1, req("b", 64, 1, prefix_from="zzz"))))
    assert (err.line, err.field) == (2, "requests[0].prefix_from")
    assert "'zzz' is not a known request" in err.reason


def test_rejects_prefix_from_in_the_same_batch() -> None:
    err = trace_error(text(line(0, req("a", 0, 300), req("b", 64, 1, prefix_from="a"))))
    assert (err.line, err.field) == (1, "requests[1].prefix_from")
    assert "first appears in this batch" in err.reason


def test_rejects_prefix_from_sharing_tokens_computed_in_the_same_batch() -> None:
    # a has 64 tokens before batch 1 and computes 64 more in it; b may share only 64.
    err = trace_error(
        text(line(0, req("a", 0, 64)), line(1, req("a", 64, 64), req("b", 128, 1, prefix_from="a")))
    )
    assert (err.line, err.field) == (2, "requests[1].prefix_len")
    assert "exceeds the 64 tokens 'a' has" in err.reason


def test_rejects_continuation_with_wrong_prefix_len() -> None:
    err = trace_error(text(line(0, req("a", 0, 300)), line(1, req("a", 256, 1))))
    assert (err.line, err.field) == (2, "requests[0].prefix_len")
    assert "prefix_len must be 300, got 256" in err.reason


def test_rejects_prefix_from_on_continuation() -> None:
    err = trace_error(
        text(line(0, req("a", 0, 300), req("c", 0, 64)), line(1, req("a", 300, 1, prefix_from="c")))
    )
    assert (err.line, err.field) == (2, "requests[0].prefix_from")
    assert "continues" in err.reason


def test_rejects_unaligned_prefix_hit() -> None:
    err = trace_error(text(line(0), line(1, req("b", 100, 1, prefix_from="a"))))
    assert (err.line, err.field) == (2, "requests[0].prefix_len")
    assert "page-aligned" in err.reason and "page_size=64" in err.reason


def test_rejects_prefix_longer_than_source() -> None:
    err = trace_error(text(line(0), line(1, req("b", 320, 1, prefix_from="a"))))
    assert (err.line, err.field) == (2, "requests[0].prefix_len")
    assert "exceeds the 300 tokens" in err.reason


def test_rejects_duplicate_rid_in_batch() -> None:
    err = trace_error(text(line(0), line(1, req("a", 300, 1), req("a", 300, 1))))
    assert (err.line, err.field) == (2, "requests[1].rid")
    assert "twice" in err.reason


def test_rejects_new_rid_with_prefix_but_no_prefix_from() -> None:
    err = trace_error(text(line(0, req("a", 64, 1))))
    assert (err.line, err.field) == (1, "requests[0].prefix_from")
    assert "no prefix_from" in err.reason


def test_rejects_prefix_from_with_zero_prefix_len() -> None:
    err = trace_error(text(line(0), line(1, req("b", 0, 1, prefix_from="a"))))
    assert err.field == "requests[0].prefix_from"
    assert "prefix_from given but prefix_len is 0" in err.reason


def test_error_names_file_line_after_blank_lines() -> None:
    err = trace_error(text(line(0), "", "", line(1, req("a", 1, 1))))
    assert str(err).startswith("trace.jsonl:4: requests[0].prefix_len:")


def test_validate_trace_defaults_line_numbers_to_index_plus_one() -> None:
    batches = (BatchSpec(0, (RequestSpec("a", 0, 8),)), BatchSpec(1, (RequestSpec("a", 0, 8),)))
    with pytest.raises(TraceError, match=r"^<trace>:2: requests\[0\].prefix_len: .*must be 8"):
        validate_trace(batches, page_size=4)


def test_load_trace_reports_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.jsonl"
    with pytest.raises(TraceError, match="not found") as info:
        load_trace(path, PAGE)
    assert (info.value.source, info.value.line, info.value.field) == (str(path), None, None)
