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

import difflib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import ErrorDetails

from cpkv_core.batch import BatchSpec, RequestSpec

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


class TraceError(ValueError):
    """A trace that cannot run, with where the problem is.

    Attributes:
        reason: What is wrong, without the location.
        source: The file name (or ``"<trace>"``) the trace came from.
        line: 1-based line number in the source, or None when the error is not about a line.
        field: Dotted path of the offending field, e.g. ``requests[1].extend_len``, or None.
    """

    def __init__(
        self,
        reason: str,
        source: str = "<trace>",
        line: int | None = None,
        field: str | None = None,
    ) -> None:
        self.reason = reason
        self.source = source
        self.line = line
        self.field = field
        super().__init__(self._format())

    def _format(self) -> str:
        where = self.source if self.line is None else f"{self.source}:{self.line}"
        what = self.reason if self.field is None else f"{self.field}: {self.reason}"
        return f"{where}: {what}"

    def __reduce__(self) -> tuple[Any, ...]:
        # NOTE: keeps the attributes when the error crosses a process boundary (pickle).
        return (type(self), (self.reason, self.source, self.line, self.field))


_LINE_CONFIG = ConfigDict(frozen=True, extra="forbid", strict=True)


class RequestLine(BaseModel):
    """Schema of one request in a trace line."""

    model_config = _LINE_CONFIG

    rid: str = Field(min_length=1)
    """Request id; the same id in a later batch continues the request (chunked prefill)."""
    prefix_len: int = Field(ge=0)
    """Tokens already in the KV cache before this batch."""
    extend_len: int = Field(ge=1)
    """Tokens computed in this batch."""
    prefix_from: str | None = Field(default=None, min_length=1)
    """For a new rid with ``prefix_len > 0``: the earlier request whose prefix it shares."""
    return_logprob: bool = False
    """The request asks for logprobs (needs every hidden state)."""
    capture_hidden: bool = False
    """The request asks for hidden states (needs every hidden state)."""


class BatchLine(BaseModel):
    """Schema of one trace line (one prefill batch)."""

    model_config = _LINE_CONFIG

    batch: int
    """0-based index of the batch; must equal its position among the non-blank lines."""
    spec: str | None = Field(default=None, min_length=1)
    """Speculative algorithm's name (e.g. ``"EAGLE"``), or null."""
    requests: list[RequestLine] = Field(min_length=1)
    """The batch's requests, in batch order."""


@dataclass(frozen=True, slots=True)
class Trace:
    """A parsed trace: its batches and the 1-based source line of each."""

    source: str
    batches: tuple[BatchSpec, ...]
    line_numbers: tuple[int, ...]


# ---------------------------------------------------------------------------------------
# Schema errors -> messages
# ---------------------------------------------------------------------------------------


def _show(value: object) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def _field_path(loc: Sequence[int | str]) -> str | None:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(f".{item}" if parts else item)
    return "".join(parts) or None


def _unknown_field_reason(loc: Sequence[int | str]) -> str:
    model = RequestLine if len(loc) == 3 and loc[0] == "requests" else BatchLine
    allowed = list(model.model_fields)
    close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown field; allowed fields are {', '.join(allowed)}{hint}"


_TYPE_NAMES = {
    "int_type": "an integer",
    "string_type": "a string",
    "bool_type": "true or false",
    "list_type": "a JSON array",
    "model_type": "a JSON object",
    "dict_type": "a JSON object",
}


def _schema_reason(err: ErrorDetails) -> str:
    kind, ctx, got = err["type"], err.get("ctx", {}), _show(err.get("input"))
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        return _unknown_field_reason(err["loc"])
    if kind == "greater_than_equal":
        return f"must be >= {ctx['ge']}, got {got}"
    if kind == "string_too_short":
        return "must be a non-empty string, got an empty string"
    if kind == "too_short":
        return "must be a non-empty list, got an empty list"
    if kind in _TYPE_NAMES:
        return f"must be {_TYPE_NAMES[kind]}, got {got}"
    return f"{err['msg']}, got {got}"


def _first_error(exc: ValidationError) -> ErrorDetails:
    errors = exc.errors()
    # NOTE: a misspelt field shows up as both "missing" and "unknown"; the unknown one
    # names the typo, so it is reported first.
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    return (unknown or errors)[0]


def _schema_error(exc: ValidationError, source: str, line: int) -> TraceError:
    err = _first_error(exc)
    if err["type"] == "json_invalid":
        detail = err.get("ctx", {}).get("error", err["msg"])
        return TraceError(
            f"invalid JSON ({detail}); each line must be one JSON object", source, line
        )
    field = _field_path(err["loc"])
    reason = _schema_reason(err)
    if field is None:
        reason = f"each line must be one JSON object with batch and requests; {reason}"
    return TraceError(reason, source, line, field)


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
        raise _schema_error(exc, source, line) from None
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
