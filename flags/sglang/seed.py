"""Flag names SGLang 0.5.23 no longer reads, read anyway with a warning: :func:`translate_seed`.

A migration tool reads old commands. The seed series (the SGLang releases cpkv started
from) spelled prefill CP ``--enable-nsa-prefill-context-parallel``, its DSA aliases and
``--nsa-prefill-cp-mode``; 0.5.23 renamed them and refuses the old names ("unrecognized
arguments"). cpkv's own phase flags are not SGLang's at all. Each such name is translated to
its 0.5.23 replacement (or, with none, kept for cpkv alone) with a warning naming what to
use instead, before SGLang's parser reads the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from flags.model import PHASE_FLAGS, FlagError
from flags.sglang.table import SGLANG_VERSION
from phases.ids import PhaseId

CP_MODE_STRATEGIES = {"in-seq-split": "zigzag", "round-robin-split": "interleave"}
"""The seed's ``--nsa-prefill-cp-mode`` values to 0.5.23's ``--cp-strategy`` values."""


@dataclass(frozen=True, slots=True)
class SeedName:
    """An old or cpkv-only option and what 0.5.23 reads instead."""

    replacement: str | None
    """The 0.5.23 option it becomes (``--enable-prefill-cp``); None when there is none."""
    takes_value: bool = False
    field: str | None = None
    """The cpkv flag it sets when there is no replacement."""
    why: str = ""
    """Why there is no replacement, for the warning."""


_CP_SWITCH = SeedName("--enable-prefill-cp")
_CP_MODE = SeedName("--cp-strategy", takes_value=True)
_SHARED_KV = SeedName("--enable-kv-cache-sharding")
_MIN_TOKENS = SeedName(
    None,
    takes_value=True,
    field="nsa_prefill_cp_min_tokens",
    why="0.5.23 decides per batch whether to split (its CP split gate); cpkv keeps the threshold",
)

SEED_NAMES: dict[str, SeedName] = {
    "--enable-nsa-prefill-context-parallel": _CP_SWITCH,
    "--enable-dsa-prefill-context-parallel": _CP_SWITCH,
    "--enable-prefill-context-parallel": _CP_SWITCH,
    "--nsa-prefill-cp-mode": _CP_MODE,
    "--dsa-prefill-cp-mode": _CP_MODE,
    "--nsa-prefill-cp-min-tokens": _MIN_TOKENS,
    "--dsa-prefill-cp-min-tokens": _MIN_TOKENS,
    "--enable-nsa-prefill-cp-shared-kv": _SHARED_KV,
    "--enable-dsa-prefill-cp-shared-kv": _SHARED_KV,
}
"""The seed series' CP names, each with its 0.5.23 replacement."""

CPKV_ONLY: dict[str, SeedName] = {
    **{
        flag: SeedName(None, field=flag[2:].replace("-", "_"), why=f"cpkv's phase {int(p)} flag")
        for p, flag in PHASE_FLAGS.items()
        if p is not PhaseId.SHARDED_KV
    },
    "--disaggregation-decode-cp-size": SeedName(
        None,
        takes_value=True,
        field="disaggregation_decode_cp_size",
        why="cpkv's flag; 0.5.23 runs no prefill CP on a decode worker",
    ),
}
"""cpkv's own options, read from a launch command for cpkv alone."""


@dataclass(frozen=True, slots=True)
class Translated:
    """A command's arguments with the old names replaced."""

    argv: tuple[str, ...]
    """What SGLang 0.5.23's parser reads."""
    extra: dict[str, tuple[Any, str]] = field(default_factory=dict)
    """cpkv flags set by names with no replacement: field to (raw value, ``sglang:NAME``)."""
    renamed: dict[str, str] = field(default_factory=dict)
    """0.5.23 option to the old name the command used for it."""
    warnings: tuple[str, ...] = ()


def translate_seed(argv: Sequence[str]) -> Translated:
    """Replaces seed-series names (exact, or ``NAME=value``) by their 0.5.23 options.

    Raises:
        FlagError: an old name misses its value, gives one to a switch, or a bad CP mode.
    """
    out: list[str] = []
    extra: dict[str, tuple[Any, str]] = {}
    renamed: dict[str, str] = {}
    warnings: list[str] = []
    i = 0
    while i < len(argv):
        name, eq, inline = argv[i].partition("=")
        seed = SEED_NAMES.get(name) or CPKV_ONLY.get(name)
        if seed is None or not argv[i].startswith("--"):
            out.append(argv[i])
            i += 1
            continue
        value, i = _value(argv, i, name, seed, inline if eq else None)
        warnings.append(_warning(name, seed))
        if seed.replacement is None:
            assert seed.field is not None, f"{name} has neither a replacement nor a field"
            extra[seed.field] = (True if value is None else value, f"sglang:{name}")
            continue
        renamed[seed.replacement] = name
        out += [seed.replacement] if value is None else [seed.replacement, _strategy(name, value)]
    return Translated(tuple(out), extra, renamed, tuple(warnings))


def _value(
    argv: Sequence[str], i: int, name: str, seed: SeedName, inline: str | None
) -> tuple[str | None, int]:
    if not seed.takes_value:
        if inline is not None:
            raise FlagError(f"{name} is a switch and takes no value, got {inline!r}")
        return None, i + 1
    if inline is not None:
        return inline, i + 1
    if i + 1 >= len(argv):
        raise FlagError(f"{name} needs a value")
    return argv[i + 1], i + 2


def _strategy(name: str, value: str) -> str:
    if name not in ("--nsa-prefill-cp-mode", "--dsa-prefill-cp-mode"):
        return value
    if value not in CP_MODE_STRATEGIES:
        choices = ", ".join(CP_MODE_STRATEGIES)
        raise FlagError(f"{name} must be one of {choices}, got {value!r}")
    return CP_MODE_STRATEGIES[value]


def _warning(name: str, seed: SeedName) -> str:
    if seed.replacement is not None:
        warning = (
            f"{name} is a seed-series name SGLang {SGLANG_VERSION} refuses; read as its "
            f"replacement {seed.replacement}"
        )
        if seed is _CP_MODE:
            pairs = ", ".join(f"{old} -> {new}" for old, new in CP_MODE_STRATEGIES.items())
            warning += f" ({pairs})"
        return warning
    what = "a seed-series name" if name in SEED_NAMES else "not an SGLang option"
    return (
        f"{name} is {what} SGLang {SGLANG_VERSION} refuses and has no replacement "
        f"({seed.why}); cpkv reads it for itself"
    )
