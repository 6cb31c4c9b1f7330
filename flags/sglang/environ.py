"""SGLang 0.5.23's reading of its environment variables: :func:`env_bool`.

``sglang/srt/environ.py`` declares each variable with a type. A boolean (``EnvBool``) is
``true``, ``1``, ``yes`` or ``y`` for True and ``false``, ``0``, ``no`` or ``n`` for False, in
any case; anything else (``on``, ``enabled``, an empty value) warns and is the variable's
default. cpkv reads a launch command's ``NAME=value`` assignments by the same table.
"""

from __future__ import annotations

from collections.abc import Mapping

TRUE = frozenset({"true", "1", "yes", "y"})
FALSE = frozenset({"false", "0", "no", "n"})

BOOL_DEFAULTS: dict[str, bool] = {
    "SGLANG_DISAGG_STAGING_BUFFER": False,
    "SGLANG_ENABLE_POST_CAPTURE_KV_SIZING": False,
    "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": False,
    "SGLANG_IS_IN_CI": False,
}
"""The boolean variables cpkv's rules read, to their default in ``environ.py``."""

STR_DEFAULTS: dict[str, str] = {"SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": "rust"}
"""The string variables cpkv's rules read, to their default in ``environ.py``."""


def env_bool(env: Mapping[str, str], name: str) -> bool:
    """Variable ``name`` as SGLang's ``EnvBool`` reads it from ``env`` (module docstring)."""
    raw = env.get(name)
    if raw is None:
        return BOOL_DEFAULTS[name]
    value = raw.lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    return BOOL_DEFAULTS[name]


def env_bool_invalid(env: Mapping[str, str], name: str) -> bool:
    """True when ``env`` sets ``name`` to a value SGLang warns about and ignores."""
    raw = env.get(name)
    return raw is not None and raw.lower() not in TRUE | FALSE
