"""What ``register()`` does when SGLang's ``load_plugins()`` calls it: :func:`install`.

1. Reads cpkv's settings from the CLI's sources (defaults < ``$CPKV_CONFIG`` or
   ``./cpkv.toml`` < ``CPKV_*``).
2. With no phase flag and no CP minimum on, installs nothing (one log line says so).
3. Refuses a SGLang other than the pinned 0.5.23, and any hook target that does not
   resolve.
4. Registers the hooks of the jobs that are on (:data:`~cpkv_sglang.targets.HOOKS`):
   the start-up check always, the gate with phase 1 or a CP minimum, the tail with phase 1.
   SGLang applies them right after this returns.

A refusal here raises ``SystemExit``: ``load_plugins()`` catches ``Exception`` from a
plugin and only logs it, which would let the server start without cpkv's checks.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from cpkv_sglang import targets
from cpkv_sglang.state import LOG, Installed, set_installed
from cpkv_sglang.targets import Hook, HookGroup, resolve_targets
from flags import SGLANG_VERSION, FlagError, FlagSet, resolve_flags

__all__ = ["PINNED", "groups_for", "install", "sglang_version"]

PINNED = SGLANG_VERSION
"""The SGLang version whose functions the hooks wrap (read at each ``install``)."""


def sglang_version() -> str | None:
    """The installed sglang distribution's version, or None."""
    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


def groups_for(flags: FlagSet) -> frozenset[HookGroup]:
    """The hook groups these settings need; empty when nothing cpkv does is on."""
    narrow = flags.enable_nsa_prefill_cp_narrow_output
    if not flags.flagged_phases() and flags.nsa_prefill_cp_min_tokens == 0:
        return frozenset()
    groups = {HookGroup.STARTUP}
    if narrow or flags.nsa_prefill_cp_min_tokens > 0:
        groups.add(HookGroup.GATE)
    if narrow:
        groups.add(HookGroup.TAIL)
    return frozenset(groups)


def install() -> Installed | None:
    """Registers the hooks the settings need (see the module docstring).

    Returns:
        What was installed, or None when nothing is on.

    Raises:
        SystemExit: bad settings, the wrong SGLang version or a target that does not
            resolve, with a message that names it.
    """
    try:
        settings = resolve_flags()
    except FlagError as exc:
        raise SystemExit(f"cpkv plugin refuses to start: {exc}") from exc
    groups = groups_for(settings.flags)
    found, pinned = sglang_version(), PINNED
    if not groups:
        LOG.info(
            "cpkv plugin: no cpkv phase or CP minimum is on "
            "(CPKV_ENABLE_NSA_PREFILL_CP_NARROW_OUTPUT, CPKV_NSA_PREFILL_CP_MIN_TOKENS, "
            "$CPKV_CONFIG); no hooks installed"
        )
        if found != pinned:
            LOG.warning("cpkv plugin: sglang %s is not %s, the version it wraps", found, pinned)
        set_installed(None)
        return None
    if found != pinned:
        raise SystemExit(
            f"cpkv plugin refuses to start: it wraps sglang {pinned}'s functions, but sglang "
            f"{found} is installed; install sglang=={pinned} or turn cpkv's phases off"
        )
    hooks = tuple(hook for hook in targets.HOOKS if hook.group in groups)
    try:
        originals = resolve_targets(hooks)
    except LookupError as exc:
        raise SystemExit(f"cpkv plugin refuses to start: {exc}") from exc
    done = Installed(settings, hooks, originals)
    set_installed(done)
    _register(hooks)
    LOG.info("cpkv plugin: registered %d hooks (%s)", len(hooks), ", ".join(sorted(groups)))
    return done


def _register(hooks: tuple[Hook, ...]) -> None:
    import importlib

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for hook in hooks:
        module, _, name = hook.hook.partition(":")
        function = getattr(importlib.import_module(module), name)
        HookRegistry.register(hook.target, function, HookType[hook.kind])
