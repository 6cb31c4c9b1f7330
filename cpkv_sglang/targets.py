"""Every function of SGLang 0.5.23 the plugin wraps, in one table: :data:`HOOKS`.

A hook target is a stable contract: each row names its dotted path, its file in the wheel,
why it is wrapped, and the call sites that must hold the wrapper once SGLang's
``HookRegistry.apply_hooks()`` has run (``_propagate_patch`` rewrites the ``from X import Y``
bindings of modules already loaded; a module loaded later binds the wrapper itself).

SGLang only logs a target that fails to resolve or apply. So the plugin resolves every
target itself when it registers (:func:`resolve_targets`) and checks, after the hooks are
applied, that a wrapper over the original sits at the target and at every loaded call
site (:func:`unlanded`): by its ``__wrapped__`` chain, not by identity, so that another
plugin's wrapper over cpkv's still counts.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["HOOKS", "Hook", "HookGroup", "Site", "resolve_targets", "unlanded"]


class HookGroup(StrEnum):
    """Which job a hook does; the plugin installs a group only when its job is on."""

    STARTUP = "startup"
    """Start-up contracts and the landing check, in the scheduler process."""
    GATE = "gate"
    """Per-batch split decision (SGLang's rule, then cpkv's CP-off minimum)."""
    TAIL = "tail"
    """Phase 1: the narrow tail gather and its shadow."""


@dataclass(frozen=True, slots=True)
class Site:
    """Where a wrapped function is looked up when SGLang calls it: ``owner.attr``, with
    ``owner`` a module or ``module:Class``."""

    owner: str
    attr: str

    def __str__(self) -> str:
        return f"{self.owner}.{self.attr}"


@dataclass(frozen=True, slots=True)
class Hook:
    """One wrapped SGLang function."""

    target: str
    """Dotted path as ``HookRegistry.register`` takes it."""
    kind: str
    """``AROUND`` or ``AFTER`` (``HookType`` member name)."""
    hook: str
    """The cpkv function that implements it, ``module:function``."""
    file: str
    """The target's file inside the wheel (``sglang/...``)."""
    group: HookGroup
    why: str
    sites: tuple[Site, ...] = ()
    """Call sites besides the target itself that must hold the wrapper."""

    @property
    def owner_path(self) -> str:
        """The module or ``module.Class`` that holds the target."""
        return self.target.rsplit(".", 1)[0]

    @property
    def attr(self) -> str:
        """The target's attribute name."""
        return self.target.rsplit(".", 1)[1]


_CP = "sglang.srt.layers.cp"
_EAGER = "sglang.srt.model_executor.runner.eager_runner"
_DSA_UTILS = "sglang.srt.layers.attention.dsa.utils"

HOOKS: tuple[Hook, ...] = (
    Hook(
        "sglang.srt.runtime_context.publish",
        "AFTER",
        "cpkv_sglang.startup:after_publish",
        "sglang/srt/runtime_context.py",
        HookGroup.STARTUP,
        "the scheduler publishes its resolved ServerArgs right after loading plugins: run "
        "cpkv's start-up contracts and check that every wrapper landed",
        (Site("sglang.srt.managers.scheduler", "publish"),),
    ),
    Hook(
        f"{_CP}.zigzag.ZigzagCPStrategy.can_apply",
        "AROUND",
        "cpkv_sglang.gate:around_can_apply",
        "sglang/srt/layers/cp/zigzag.py",
        HookGroup.GATE,
        "the per-batch split decision (is_cp_active calls it)",
    ),
    Hook(
        f"{_CP}.interleave.InterleaveCPStrategy.can_apply",
        "AROUND",
        "cpkv_sglang.gate:around_can_apply",
        "sglang/srt/layers/cp/interleave.py",
        HookGroup.GATE,
        "the per-batch split decision (is_cp_active calls it)",
    ),
    Hook(
        f"{_DSA_UTILS}.can_dsa_prefill_cp_interleave",
        "AROUND",
        "cpkv_sglang.gate:around_can_dsa_interleave",
        "sglang/srt/layers/attention/dsa/utils.py",
        HookGroup.GATE,
        "the DSA backend's own copy of interleave's can_apply (init_forward_metadata, "
        "pad_dsa_cache_seqlens): it must agree with the gate",
        (Site("sglang.srt.layers.attention.dsa_backend", "can_dsa_prefill_cp_interleave"),),
    ),
    Hook(
        f"{_EAGER}.EagerRunner._execute_extend_cp",
        "AROUND",
        "cpkv_sglang.tail:around_execute_extend_cp",
        "sglang/srt/model_executor/runner/eager_runner.py",
        HookGroup.TAIL,
        "marks the CP forward whose tail gather phase 1 narrows",
    ),
    Hook(
        f"{_CP}.utils.cp_shard_model_inputs",
        "AROUND",
        "cpkv_sglang.tail:around_shard_model_inputs",
        "sglang/srt/layers/cp/utils.py",
        HookGroup.TAIL,
        "the model body runs inside it: a gather after it closes is the tail, one inside "
        "(the DSA top-k share) is not",
        (Site(_EAGER, "cp_shard_model_inputs"),),
    ),
    Hook(
        f"{_CP}.utils.cp_gather_after_forward",
        "AROUND",
        "cpkv_sglang.tail:around_gather_after_forward",
        "sglang/srt/layers/cp/utils.py",
        HookGroup.TAIL,
        "the tail all-gather of every token's hidden state: phase 1 gathers cp x bs rows",
        (Site(_EAGER, "cp_gather_after_forward"),),
    ),
    Hook(
        "sglang.srt.layers.logits_processor.LogitsProcessor._get_pruned_states",
        "AROUND",
        "cpkv_sglang.tail:around_get_pruned_states",
        "sglang/srt/layers/logits_processor.py",
        HookGroup.TAIL,
        "keeps each request's last row; given phase 1's rows it keeps all of them",
    ),
)
"""Every hook the plugin may install, by group."""


def _owner(path: str) -> object:
    """The module or class ``path`` names (``pkg.mod`` or ``pkg.mod.Class``)."""
    module, _, rest = path.partition(":")
    if rest:
        return getattr(importlib.import_module(module), rest)
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError:
        parent, _, name = path.rpartition(".")
        return getattr(importlib.import_module(parent), name)


def resolve_targets(hooks: tuple[Hook, ...]) -> dict[str, object]:
    """Each hook's target as it is now, before any wrapper (the originals).

    Raises:
        LookupError: a target's module or attribute does not exist; the message names it
            and the wheel file it was read from.
    """
    originals: dict[str, object] = {}
    for hook in hooks:
        try:
            owner = _owner(hook.owner_path)
            originals[hook.target] = _raw(owner, hook.attr)
        except (ImportError, AttributeError) as exc:
            raise LookupError(
                f"hook target {hook.target} ({hook.file} in sglang 0.5.23) does not resolve: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
    return originals


def _raw(owner: object, attr: str) -> object:
    """``owner.attr`` without the descriptor protocol (a class's plain function)."""
    if isinstance(owner, type):
        for klass in owner.__mro__:
            if attr in vars(klass):
                raw = vars(klass)[attr]
                return getattr(raw, "__func__", raw)
        raise AttributeError(f"type object {owner.__name__!r} has no attribute {attr!r}")
    return getattr(owner, attr)


def _wraps(candidate: object, original: object) -> bool:
    """True when ``candidate`` is a wrapper whose ``__wrapped__`` chain reaches ``original``."""
    seen = 0
    current = candidate
    while current is not original and seen < 16:
        current = getattr(current, "__wrapped__", None)
        if current is None:
            return False
        seen += 1
    return current is original and candidate is not original


def unlanded(hooks: tuple[Hook, ...], originals: dict[str, object]) -> list[str]:
    """The places where a wrapper did not land: the target itself, or a call site in a
    module already loaded that still holds the original (or anything else)."""
    missing = []
    for hook in hooks:
        original = originals[hook.target]
        places = [(hook.owner_path, hook.attr), *((s.owner, s.attr) for s in hook.sites)]
        for owner_path, attr in places:
            module = owner_path.partition(":")[0]
            if owner_path != hook.owner_path and module not in sys.modules:
                continue  # NOTE: a module imported later binds the wrapper from its source
            try:
                found = _raw(_owner(owner_path), attr)
            except (ImportError, AttributeError):
                missing.append(f"{owner_path}.{attr} (gone)")
                continue
            if not _wraps(found, original):
                missing.append(f"{owner_path}.{attr} (still {_describe(found)})")
    return missing


def _describe(value: object) -> str:
    name = getattr(value, "__qualname__", None) or type(value).__name__
    return f"{getattr(value, '__module__', '?')}.{name}"
