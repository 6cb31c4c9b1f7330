"""The trace format: JSON Lines, one prefill batch a line; parse, validate, load.

A line looks like::

    {"batch": 0, "spec": null, "requests": [
      {"rid": "a", "prefix_len": 0, "extend_len": 300},
      {"rid": "b", "prefix_len": 128, "extend_len": 40, "prefix_from": "a"}]}

Each line is checked against a strict schema (``parse_trace_lines``), then the whole trace
against the rules that need history (``validate_trace``): chunked-prefill continuations and
page-aligned prefix sharing. ``load_trace`` and ``parse_trace_text`` do both. Every error is
a ``TraceError`` naming the source, the 1-based line and the field.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from cpkv_core.planning.batch import BatchSpec, RequestSpec
from cpkv_core.traces.schema import BatchLine, RequestLine, TraceError, schema_error

__all__ = [
    "BatchLine",
    "RequestLine",
    "Trace",
    "TraceError",
    "load_trace",
    "parse_trace_lines",
    "parse_trace_text",
    "validate_trace",
]


@dataclass(frozen=True, slots=True)
class Trace:
    """A parsed trace: its batches and the 1-based source line of each."""

    source: str
    batches: tuple[BatchSpec, ...]
    line_numbers: tuple[int, ...]


# ---------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------


def _to_batch(parsed: BatchLine) -> BatchSpec:
    requests = tuple(RequestSpec(**r.model_dump()) for r in parsed.requests)
    return BatchSpec(batch=parsed.batch, requests=requests, spec=parsed.spec)


def _parse_line(text: str, index: int, source: str, line: int) -> BatchSpec:
    try:
        parsed = BatchLine.model_validate_json(text)
    except ValidationError as exc:
        raise schema_error(exc, source, line) from None
    if parsed.batch != index:
        raise TraceError(
            f"expected batch {index} (batches are numbered 0, 1, 2, ... in line order, "
            f"blank lines skipped), got {parsed.batch}",
            source,
            line,
            "batch",
        )
    return _to_batch(parsed)


def _parse(lines: Iterable[str], source: str) -> Trace:
    batches: list[BatchSpec] = []
    line_numbers: list[int] = []
    for line, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        batches.append(_parse_line(text, len(batches), source, line))
        line_numbers.append(line)
    if not batches:
        raise TraceError("trace has no batches; write one JSON object per line", source)
    return Trace(source, tuple(batches), tuple(line_numbers))


def parse_trace_lines(lines: Iterable[str], source: str = "<trace>") -> tuple[BatchSpec, ...]:
    """Parses trace lines against the per-line schema, without the whole-trace rules.

    Args:
        lines: The lines of a trace; blank lines are skipped but still counted.
        source: Name used in error messages (usually the file name).

    Returns:
        One BatchSpec per non-blank line, in order.

    Raises:
        TraceError: A line is not valid JSON, breaks the schema, or is misnumbered; or
            there is no batch at all.
    """
    return _parse(lines, source).batches


# ---------------------------------------------------------------------------------------
# Whole-trace rules
# ---------------------------------------------------------------------------------------


def _continuation_problem(req: RequestSpec, tokens: int) -> tuple[str, str] | None:
    if req.prefix_from is not None:
        return "prefix_from", (
            f"{req.rid!r} continues an earlier chunk, so prefix_from is not allowed "
            f"(got {req.prefix_from!r}); remove it"
        )
    if req.prefix_len != tokens:
        return "prefix_len", (
            f"{req.rid!r} continues an earlier chunk and has {tokens} tokens so far, so "
            f"prefix_len must be {tokens}, got {req.prefix_len}"
        )
    return None


def _shared_prefix_problem(
    req: RequestSpec,
    tokens: Mapping[str, int],
    in_batch: set[str],
    page_size: int,
) -> tuple[str, str] | None:
    src = req.prefix_from
    if src is None:
        return "prefix_from", (
            f"new request {req.rid!r} has prefix_len={req.prefix_len} but no prefix_from; "
            "name the earlier request it shares the prefix with, or set prefix_len to 0"
        )
    if req.prefix_len == 0:
        return "prefix_from", (
            f"prefix_from given but prefix_len is 0 (nothing to share); remove prefix_from "
            f"{src!r} or give the shared prefix length"
        )
    if src not in tokens:
        where = "first appears in this batch" if src in in_batch else "is not a known request"
        return "prefix_from", (
            f"prefix_from {src!r} {where}; a prefix can only be shared from a request "
            "of an earlier batch"
        )
    if req.prefix_len % page_size:
        return "prefix_len", (
            f"a shared prefix (radix-cache hit) must be page-aligned: prefix_len="
            f"{req.prefix_len} is not a multiple of page_size={page_size}"
        )
    if req.prefix_len > tokens[src]:
        return "prefix_len", (
            f"prefix_len={req.prefix_len} exceeds the {tokens[src]} tokens {src!r} has "
            "before this batch"
        )
    return None


def _request_problem(
    req: RequestSpec,
    tokens: Mapping[str, int],
    in_batch: set[str],
    page_size: int,
) -> tuple[str, str] | None:
    if req.prefix_len < 0:
        return "prefix_len", f"must be >= 0, got {req.prefix_len}"
    if req.extend_len < 1:
        return "extend_len", f"must be >= 1, got {req.extend_len}"
    if req.rid in in_batch:
        return "rid", f"{req.rid!r} appears twice in this batch; a rid may appear once"
    if req.rid in tokens:
        return _continuation_problem(req, tokens[req.rid])
    if req.prefix_len > 0 or req.prefix_from is not None:
        return _shared_prefix_problem(req, tokens, in_batch, page_size)
    return None


def _validate_batch(
    batch: BatchSpec,
    index: int,
    tokens: dict[str, int],
    page_size: int,
) -> tuple[str, str] | None:
    if batch.batch != index:
        return "batch", f"expected batch {index}, got {batch.batch}"
    if not batch.requests:
        return "requests", "must be a non-empty list, got an empty list"
    in_batch: set[str] = set()
    for i, req in enumerate(batch.requests):
        problem = _request_problem(req, tokens, in_batch, page_size)
        if problem is not None:
            return f"requests[{i}].{problem[0]}", problem[1]
        in_batch.add(req.rid)
    # NOTE: lengths are updated after the whole batch: a request of this batch cannot
    # share tokens that are being computed in the same batch.
    tokens.update((req.rid, req.seq_len) for req in batch.requests)
    return None


def validate_trace(
    batches: Sequence[BatchSpec],
    page_size: int,
    source: str = "<trace>",
    line_numbers: Sequence[int] | None = None,
) -> None:
    """Checks the rules that need the whole trace.

    A rid seen in an earlier batch continues (its ``prefix_len`` equals its tokens so far,
    no ``prefix_from``); a new rid with ``prefix_len > 0`` shares a page-aligned prefix of a
    request from an earlier batch; a rid appears at most once per batch.

    Args:
        batches: The trace's batches, in order.
        page_size: Tokens per KV page; shared prefixes must be multiples of it.
        source: Name used in error messages.
        line_numbers: 1-based source line of each batch; defaults to ``index + 1``.

    Raises:
        TraceError: The first rule broken, naming the line and field.
        ValueError: ``page_size < 1`` or ``line_numbers`` of the wrong length.
    """
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    lines = tuple(line_numbers) if line_numbers is not None else tuple(range(1, len(batches) + 1))
    if len(lines) != len(batches):
        raise ValueError(f"got {len(lines)} line numbers for {len(batches)} batches")
    tokens: dict[str, int] = {}
    for index, (batch, line) in enumerate(zip(batches, lines, strict=True)):
        problem = _validate_batch(batch, index, tokens, page_size)
        if problem is not None:
            raise TraceError(problem[1], source, line, problem[0])


# ---------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------


def parse_trace_text(text: str, page_size: int, source: str = "<trace>") -> Trace:
    """Parses and validates a whole trace held in a string.

    Raises:
        TraceError: The first problem found, naming the line and field.
    """
    trace = _parse(text.splitlines(), source)
    validate_trace(trace.batches, page_size, source, trace.line_numbers)
    return trace


def load_trace(path: str | Path, page_size: int) -> Trace:
    """Reads, parses and validates a trace file; nothing runs if any line is bad.

    Raises:
        TraceError: The file cannot be read, or the first problem found in it.
    """
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise TraceError("trace file not found; check the path", source) from None
    except UnicodeDecodeError as exc:
        raise TraceError(f"trace file is not UTF-8 text ({exc.reason})", source) from None
    except OSError as exc:
        raise TraceError(f"cannot read trace file ({exc.strerror})", source) from None
    return parse_trace_text(text, page_size, source)
