"""cpkv inside an SGLang 0.5.23 server, through SGLang's plugin framework; entry point
``register`` (entry-point group ``sglang.srt.plugins``, name ``cpkv``).

SGLang's ``load_plugins()`` calls :func:`register` in every server process. Importing this
package imports neither sglang nor torch: a ``pip install cpkv`` changes nothing until
SGLang loads the plugin, and the plugin changes nothing until a cpkv phase is on
(``CPKV_ENABLE_NSA_PREFILL_CP_NARROW_OUTPUT=1``). See ``docs/sglang-plugin.md``.
"""

from __future__ import annotations

__all__ = ["register"]


def register() -> None:
    """The plugin's entry point: registers cpkv's hooks with SGLang's ``HookRegistry``
    (:func:`cpkv_sglang.plugin.install`)."""
    from cpkv_sglang.plugin import install

    install()
