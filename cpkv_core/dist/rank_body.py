"""A rank body's typed signature, and how a fresh interpreter finds the body by name.

A rank body is ``fn(comm, *args) -> result``, a module-level function. A spawned rank
imports it by module and qualified name (``body_target``, ``import_body``), and its
arguments and result travel as typed frames by its annotations (``rank_signature``).
"""

from __future__ import annotations

import importlib
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cpkv_core.dist.typed.codec import codec_for

__all__ = ["RankSignature", "body_target", "import_body", "rank_signature"]


@dataclass(frozen=True, slots=True)
class RankSignature:
    """The annotations a rank body's arguments and result travel by."""

    args: Any
    """``tuple[...]`` of the parameters after ``comm``."""
    result: Any
    """The return annotation."""


def rank_signature(fn: Callable[..., object]) -> RankSignature:
    """The annotations of ``fn(comm, *args) -> result``, checked to be carried by the codec.

    Raises:
        TypeError: a parameter after ``comm`` or the return is not annotated, a parameter
            is keyword-only or variadic, or an annotation is one the codec cannot carry.
    """
    hints = typing.get_type_hints(fn)
    params = list(inspect.signature(fn).parameters.values())[1:]
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    missing = [p.name for p in params if p.name not in hints or p.kind not in positional]
    if missing or "return" not in hints:
        raise TypeError(
            f"{fn.__qualname__}: a rank body's arguments and result travel as typed frames; "
            f"annotate every positional parameter after comm and the return (missing: "
            f"{missing + ([] if 'return' in hints else ['return'])})"
        )
    args = tuple[tuple(hints[p.name] for p in params)] if params else tuple[()]  # type: ignore[misc]
    signature = RankSignature(args, hints["return"])
    for hint in (signature.args, signature.result):
        codec_for(hint)  # NOTE: an annotation the codec cannot carry fails here, up front
    return signature


def import_body(module: str, qualname: str) -> Callable[..., object]:
    """The module-level function a parent named."""
    found: object = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    if not callable(found):
        raise TypeError(f"{module}.{qualname} is not a function")
    return found


def body_target(fn: Callable[..., object]) -> tuple[str, str]:
    """``fn``'s module and qualified name, which a fresh interpreter imports it by."""
    if "<" in fn.__qualname__:
        raise ValueError(
            f"spawn_group runs a module-level function (ranks import it by name), got "
            f"{fn.__module__}.{fn.__qualname__}"
        )
    return fn.__module__, fn.__qualname__
