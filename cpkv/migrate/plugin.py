"""The cpkv plugin's settings on an SGLang launch command: :func:`plugin_edits`,
:func:`plugin_settings`.

The plugin is cpkv's adapter for SGLang 0.5.23's plugin framework
(``sglang/srt/plugins/__init__.py``): ``pip install cpkv`` into the server's environment
installs it under the entry point group ``sglang.srt.plugins`` as ``cpkv``, and every SGLang
process loads it (``SGLANG_PLUGINS``, when set, lists the plugins that load). It reads
cpkv's settings from the ``CPKV_*`` variables and the config file ``CPKV_CONFIG`` names
(``docs/sglang-plugin.md``).
"""

from __future__ import annotations

from typing import Any

from cpkv.migrate.launch import Edit, EditKind, LaunchCommand
from flags import CONFIG_ENV, FLAG_SPECS, PHASE_FIELDS
from phases import PhaseId

PLUGIN_GROUP = "sglang.srt.plugins"
"""SGLang 0.5.23's entry point group of general plugins."""
PLUGIN_NAME = "cpkv"
"""cpkv's entry point name in that group."""
PLUGIN_INSTALL = "pip install cpkv"
"""What puts the plugin in the server's environment."""
PLUGIN_DOCS = "docs/sglang-plugin.md"
PLUGINS_ENV = "SGLANG_PLUGINS"
"""SGLang's list of the plugins that load (comma-separated); unset or empty: all of them."""
NARROW_ENV = FLAG_SPECS[PHASE_FIELDS[PhaseId.NARROW_OUTPUT]].env
"""Phase 1's switch: ``CPKV_ENABLE_NSA_PREFILL_CP_NARROW_OUTPUT``."""
SHADOW_ENV = FLAG_SPECS["shadow_rate"].env
"""The share of batches the plugin runs twice and compares: ``CPKV_SHADOW_RATE``."""
DEFAULT_SHADOW_RATE = 0.01
"""Shadow checks on one batch in a hundred while phase 1 rolls out."""
PLUGIN_ENV = (NARROW_ENV, SHADOW_ENV, CONFIG_ENV)
"""The variables a step sets for the plugin."""


def plugin_edits(
    command: LaunchCommand, shadow_rate: float, config: str | None
) -> tuple[Edit, ...]:
    """The assignments that load the plugin with phase 1 on and its shadow at
    ``shadow_rate`` (0: off), reading ``config`` when given."""
    edits = [Edit(EditKind.ENV, NARROW_ENV, "1")]
    if shadow_rate > 0:
        edits.append(Edit(EditKind.ENV, SHADOW_ENV, f"{shadow_rate:g}"))
    if config is not None:
        edits.append(Edit(EditKind.ENV, CONFIG_ENV, config))
    listed = command.env_dict.get(PLUGINS_ENV, "")
    names = [n.strip() for n in listed.split(",") if n.strip()]
    if names and PLUGIN_NAME not in names:
        edits.append(Edit(EditKind.ENV, PLUGINS_ENV, ",".join([*names, PLUGIN_NAME])))
    return tuple(edits)


def plugin_settings(command: LaunchCommand) -> dict[str, Any]:
    """How the plugin gets into the server and what it reads from ``command``."""
    env = command.env_dict
    listed = env.get(PLUGINS_ENV, "")
    loading = (
        f"{PLUGINS_ENV}={listed}: loads the plugins listed"
        if listed
        else f"{PLUGINS_ENV} unset: every installed plugin loads; {PLUGINS_ENV}={PLUGIN_NAME} "
        "would load cpkv's alone"
    )
    return {
        "install": PLUGIN_INSTALL,
        "entry_point": {"group": PLUGIN_GROUP, "name": PLUGIN_NAME},
        "loading": loading,
        "env": {name: env[name] for name in (*PLUGIN_ENV, PLUGINS_ENV) if name in env},
        "docs": PLUGIN_DOCS,
    }
