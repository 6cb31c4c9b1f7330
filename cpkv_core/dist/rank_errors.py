"""A rank's exception as plain data: what crosses to the launcher in place of a pickle.

A rank that raises reports a ``RankError``: every exception of the chain (the one raised,
then its ``__cause__`` or ``__context__``) by class name, message and scalar attributes
(``RankFault``'s ``rank``, ``level`` and ``batch``, ``CollectiveTimeout``'s ``waited_s``,
``TraceError``'s ``line``...), and the formatted traceback for people. The launcher raises
``RankFailed`` holding it; nothing of the exception object itself crosses.
"""

from __future__ import annotations

import enum
import traceback
from dataclasses import dataclass
from typing import TypeAlias

__all__ = ["ErrorRecord", "FieldValue", "RankError", "RankFailed", "rank_error"]

FieldValue: TypeAlias = bool | int | float | str | None
"""An exception attribute the record keeps; others (objects, tensors) are left out."""

MAX_CHAIN = 16
"""Exceptions of a chain kept, outermost first."""


@dataclass(frozen=True, slots=True)
class ErrorRecord:
    """One exception: its class, message and scalar public attributes."""

    type: str
    """The class's module and qualified name, e.g. ``"cpkv_core.dist.comm.CollectiveTimeout"``."""
    message: str
    """``str(exception)``."""
    fields: tuple[tuple[str, FieldValue], ...]
    """Public instance attributes of a scalar type (an enum by its value), in order set."""

    @property
    def name(self) -> str:
        """The class's own name, e.g. ``"CollectiveTimeout"``."""
        return self.type.rsplit(".", 1)[-1]

    def field(self, name: str) -> FieldValue:
        """The attribute ``name``; KeyError when the exception had none of a scalar type."""
        for key, value in self.fields:
            if key == name:
                return value
        raise KeyError(f"{self.type} has no field {name!r} (fields: {[k for k, _ in self.fields]})")


@dataclass(frozen=True, slots=True)
class RankError:
    """What a rank that raised reports: the exception chain and its traceback."""

    chain: tuple[ErrorRecord, ...]
    """The exception raised first, then what caused it (``__cause__``, else an unsuppressed
    ``__context__``), up to ``MAX_CHAIN``."""
    traceback: str
    """The formatted traceback of the whole chain, for people."""

    def find(self, name: str) -> ErrorRecord | None:
        """The first exception of the chain whose class is called ``name``, or None."""
        return next((record for record in self.chain if record.name == name), None)


class RankFailed(RuntimeError):
    """A spawned rank raised: names the rank and holds its ``RankError``."""

    def __init__(self, rank: int, error: RankError, culprits: list[str] | None = None) -> None:
        first = f"{'; '.join(culprits)}; then " if culprits else ""
        super().__init__(f"{first}rank {rank} failed:\n{error.traceback}")
        self.rank, self.error = rank, error


def _scalar(value: object) -> tuple[bool, FieldValue]:
    if isinstance(value, enum.Enum) and type(value.value) in (int, str):
        return True, value.value
    if value is None or type(value) in (bool, int, float, str):
        return True, value  # type: ignore[return-value]
    return False, None


def _record(exc: BaseException) -> ErrorRecord:
    fields: list[tuple[str, FieldValue]] = []
    for name, value in getattr(exc, "__dict__", {}).items():
        keep, scalar = _scalar(value)
        if keep and not name.startswith("_"):
            fields.append((name, scalar))
    cls = type(exc)
    return ErrorRecord(f"{cls.__module__}.{cls.__qualname__}", str(exc), tuple(fields))


def rank_error(exc: BaseException) -> RankError:
    """``exc`` and its causes as plain data."""
    chain: list[ErrorRecord] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(chain) < MAX_CHAIN:
        seen.add(id(current))
        chain.append(_record(current))
        suppressed = current.__suppress_context__
        current = current.__cause__ or (None if suppressed else current.__context__)
    text = "".join(traceback.format_exception(exc))
    return RankError(tuple(chain), text)
