"""What a synthetic workload is: sessions of turns, each turn a prompt made of segments.

A **segment** is a run of tokens with one identity, ``(content_id, length)``: a group's
system prompt, a document, a question, a tool result. Two prompts that start with the same
segment hold the same tokens there, so the radix cache can match them. A **session** is a
sequence of turns; turn ``k + 1`` reaches the server once turn ``k``'s prefill is done
(a user's follow-up question, an agent's next step).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

Segment = tuple[str, int]
"""``(content_id, length)``: ``length`` tokens of the content called ``content_id``."""
PageKey = tuple[tuple[str, int, int], ...]
"""What one full page holds: ``(content_id, start, end)`` pieces, in order."""


@dataclass(frozen=True, slots=True)
class Turn:
    """One request: its id and its whole prompt."""

    rid: str
    segments: tuple[Segment, ...]

    @property
    def prompt_len(self) -> int:
        """Tokens of the prompt."""
        return sum(length for _, length in self.segments)


@dataclass(frozen=True, slots=True)
class Session:
    """Turns that reach the server one after another. Invariant: at least one turn."""

    turns: tuple[Turn, ...]


@dataclass(frozen=True, slots=True)
class Workload:
    """Sessions in arrival order, and how many may be in flight at once."""

    name: str
    sessions: tuple[Session, ...]
    max_concurrency: int | None = None
    """Sessions in flight at once (bench_serving's ``--max-concurrency``); None: all."""


def page_keys(segments: Sequence[Segment], page_size: int) -> list[PageKey]:
    """The key of every full page of a prompt; a partly filled last page has none.

    A page's key names the content and offsets it holds, so two prompts share a page key
    at page ``i`` exactly when they hold the same tokens there.
    """
    keys: list[PageKey] = []
    pieces: list[tuple[str, int, int]] = []
    room = page_size
    for content_id, length in segments:
        start = 0
        while start < length:
            take = min(room, length - start)
            pieces.append((content_id, start, start + take))
            start += take
            room -= take
            if room == 0:
                keys.append(tuple(pieces))
                pieces, room = [], page_size
    return keys


def extend_turn(turn: Turn, rid: str, added: Sequence[Segment]) -> Turn:
    """The next turn of a conversation: ``turn``'s whole prompt followed by ``added``."""
    return Turn(rid, turn.segments + tuple(added))
