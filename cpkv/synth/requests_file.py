"""A user's traffic summary: one request a line (JSON Lines) with its prompt length and,
optionally, a shared-prefix group or the session it continues.

::

    {"prompt_len": 3000}
    {"prompt_len": 5000, "prefix_group": "support-bot", "prefix_len": 1024}
    {"prompt_len": 5100, "prefix_group": "support-bot", "prefix_len": 1024}
    {"prompt_len": 6200, "session": "u1"}
    {"prompt_len": 9000, "session": "u1"}

Requests of one ``prefix_group`` start with the same ``prefix_len`` tokens (two requests
with different ``prefix_len`` share the shorter). A ``session`` line seen before is the
session's next turn: the previous turn's whole prompt followed by new tokens, sent once
the previous turn's prefill is done. Sessions start in line order.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from cpkv.synth.workload import Session, Turn, Workload, extend_turn


class RequestLine(BaseModel):
    """One line of a requests file."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    prompt_len: int = Field(ge=1)
    """Tokens of the whole prompt."""
    prefix_group: str | None = Field(default=None, min_length=1)
    """Requests sharing a prefix (a system prompt, a document); needs ``prefix_len``."""
    prefix_len: int | None = Field(default=None, ge=1)
    """Tokens of the group's shared prefix at the start of this prompt."""
    session: str | None = Field(default=None, min_length=1)
    """The conversation this request belongs to; its earlier turns are its prefix."""

    @model_validator(mode="after")
    def _group_has_length(self) -> RequestLine:
        if (self.prefix_group is None) != (self.prefix_len is None):
            raise ValueError("prefix_group and prefix_len go together; give both or neither")
        if self.prefix_len is not None and self.prefix_len > self.prompt_len:
            raise ValueError(f"prefix_len={self.prefix_len} exceeds prompt_len={self.prompt_len}")
        return self


def _fail(source: str, line: int, message: str) -> ValueError:
    return ValueError(f"{source}:{line}: {message}")


def _parse(text: str, source: str, line: int) -> RequestLine:
    try:
        return RequestLine.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "line"
        message = first["msg"].removeprefix("Value error, ")
        raise _fail(source, line, f"{where}: {message}") from None


def _first_turn(rid: str, line: RequestLine) -> Turn:
    own = line.prompt_len - (line.prefix_len or 0)
    segments = ((f"grp:{line.prefix_group}", line.prefix_len),) if line.prefix_len else ()
    return Turn(rid, segments + (((rid, own),) if own else ()))


def read_requests_file(path: str | Path) -> Workload:
    """The workload a requests file describes.

    Raises:
        ValueError: the file is missing or empty, or a line breaks a rule (the message
            names the file, the 1-based line and the field).
    """
    source = str(path)
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ValueError(f"{source}: cannot read the requests file ({exc.strerror})") from None
    sessions: dict[str, list[Turn]] = {}
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        line = _parse(text, source, number)
        key = line.session if line.session is not None else f"#{number}"
        rid = f"{line.session}-t{len(sessions.get(key, []))}" if line.session else f"req{number}"
        if key not in sessions:
            sessions[key] = [_first_turn(rid, line)]
            continue
        previous = sessions[key][-1]
        if line.prefix_group is not None:
            raise _fail(source, number, "prefix_group: only a session's first turn names one")
        if line.prompt_len <= previous.prompt_len:
            raise _fail(
                source,
                number,
                f"prompt_len: a later turn of session {line.session!r} holds the earlier "
                f"prompt ({previous.prompt_len} tokens) and more, got {line.prompt_len}",
            )
        added = (f"{rid}:new", line.prompt_len - previous.prompt_len)
        sessions[key].append(extend_turn(previous, rid, (added,)))
    if not sessions:
        raise ValueError(f"{source}: no requests; write one JSON object per line")
    return Workload("requests", tuple(Session(tuple(turns)) for turns in sessions.values()))
