"""A running SGLang 0.5.23 server's resolved ``ServerArgs`` as cpkv's flags:
:func:`read_server_args`.

``cpkv flags --from-sglang`` reads a launch command and resolves it as SGLang would
(:mod:`flags.sglang.args`); a server has already done that, so here the resolved fields are
read as they are (``ServerArgs.resolved_dict()``, a plain mapping of field to value). The
fields are the same ones :data:`flags.sglang.args.FLAG_DESTS` maps, by the same rules: the
strategy through :data:`~flags.sglang.args.CP_STRATEGIES`, and ``--enable-kv-cache-sharding``
as phase 2 only where SGLang shards over prefill-CP ranks. Each value's provenance is
``sglang:ServerArgs.FIELD``.

cpkv's own settings come from the same sources as the CLI (defaults < config file <
``CPKV_*`` environment, :func:`flags.resolve_flags`); the server's fields go over them,
since the server is the deployment. A config or environment value a server field replaces
is kept in the notes.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flags.model import FlagError
from flags.sglang.args import CP_STRATEGIES, FLAG_DESTS
from flags.sources import Layer, ResolvedFlags, cli_layer, merge_layers, resolve_flags

__all__ = ["SERVER_ARGS_SOURCE", "read_server_args", "server_args_layer"]

SERVER_ARGS_SOURCE = "sglang:ServerArgs."
"""Provenance prefix of a value read from a server's resolved ``ServerArgs``."""


def server_args_layer(values: Mapping[str, Any]) -> Layer:
    """cpkv's flags from a server's resolved ``ServerArgs`` fields (``values``).

    A field that is unset (None) or absent leaves its flag to the other sources; so does
    ``cp_strategy`` while prefill CP is off and ``enable_kv_cache_sharding`` unless SGLang
    shards over prefill-CP ranks (CP on, ``attn_cp_size`` > 1), as :func:`read_sglang`
    reads them.

    Raises:
        FlagError: a field holds a value cpkv's flag cannot take (the message names the
            field), e.g. an unknown strategy or transfer backend.
    """
    cp_on = bool(values.get("enable_prefill_cp"))
    cp_size = int(values.get("attn_cp_size") or 1) if cp_on else 1
    layer: Layer = {}
    for name, dest in FLAG_DESTS.items():
        value = values.get(dest)
        if value is None or (dest == "enable_kv_cache_sharding" and cp_size == 1):
            continue
        if dest == "cp_strategy":
            if not cp_on:
                continue
            if value not in CP_STRATEGIES:
                choices = ", ".join(CP_STRATEGIES)
                raise FlagError(f"ServerArgs.cp_strategy must be one of {choices}, got {value!r}")
            value = CP_STRATEGIES[value]
        try:
            layer.update(cli_layer({name: value}, SERVER_ARGS_SOURCE + dest))
        except FlagError as exc:
            raise FlagError(f"ServerArgs.{dest}: {exc}") from exc
    return layer


def read_server_args(values: Mapping[str, Any], config: Path | None = None) -> ResolvedFlags:
    """The flags of a running server: cpkv's sources (defaults < ``config`` or
    ``$CPKV_CONFIG`` < ``CPKV_*``) overlaid by its resolved ``ServerArgs`` ``values``.

    Raises:
        FlagError: a malformed config file or environment variable, or a server field
            cpkv's flag cannot take.
    """
    own = resolve_flags(config)
    server = server_args_layer(values)
    kept: Layer = {
        name: (getattr(own.flags, name), source)
        for name, source in own.sources.items()
        if source != "default"
    }
    flags, sources = merge_layers(kept, server)
    notes = [
        f"{name} = {getattr(own.flags, name)} from {kept[name][1]} is replaced by the "
        f"server's {sources[name].removeprefix('sglang:')} = {getattr(flags, name)}"
        for name in server
        if name in kept and getattr(own.flags, name) != getattr(flags, name)
    ]
    return ResolvedFlags(flags, sources, own.config, own.config_found, tuple(notes))
