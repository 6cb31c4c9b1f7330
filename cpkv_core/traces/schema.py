"""The schema of one trace line, and how a schema error becomes a message.

A bad line is reported as a ``TraceError`` naming the source, the 1-based line and the
field (``requests[1].extend_len``), with what is required and what was found.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import ErrorDetails

__all__ = ["BatchLine", "RequestLine", "TraceError", "schema_error"]


class TraceError(ValueError):
    """A trace that cannot run, with where the problem is.

    Attributes:
        reason: What is wrong, without the location.
        source: The file name (or ``"<trace>"``) the trace came from.
        line: 1-based line number in the source, or None when the error is not about a line.
        field: Dotted path of the offending field, e.g. ``requests[1].extend_len``, or None.

    From a spawned rank it reaches the launcher as typed data (``dist.rank_errors``): these
    attributes are the record's fields.
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


def schema_error(exc: ValidationError, source: str, line: int) -> TraceError:
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
