"""The plugin's state in one SGLang process: what ``register()`` installed, and the runtime
the scheduler's start-up check built (:func:`runtime`).

Every SGLang process loads plugins (main, scheduler, detokenizer, DP controller); only the
scheduler, which runs the model, builds a runtime and decides batches.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from cpkv_sglang.targets import Hook
from flags import ResolvedFlags

__all__ = ["LOG", "Installed", "Refused", "installed", "set_installed"]

LOG = logging.getLogger("cpkv_sglang")
"""The plugin's logger; SGLang's logging configuration shows its INFO lines."""


class Refused(RuntimeError):
    """The plugin refuses to let this server start (a start-up contract, a hook that did
    not land); raised where SGLang does not catch it, so the server stops."""


@dataclass(slots=True)
class Installed:
    """What ``register()`` did in this process."""

    settings: ResolvedFlags
    """cpkv's settings as the CLI reads them (defaults < config file < ``CPKV_*``)."""
    hooks: tuple[Hook, ...]
    """The hooks registered with SGLang's ``HookRegistry``."""
    originals: dict[str, object] = field(default_factory=dict)
    """Each target before any wrapper, to check that the wrapper landed."""


_INSTALLED: Installed | None = None


def set_installed(value: Installed | None) -> None:
    """Records what ``register()`` installed (None: nothing, or a fresh process)."""
    global _INSTALLED
    _INSTALLED = value


def installed() -> Installed | None:
    """What ``register()`` installed in this process, or None."""
    return _INSTALLED
