"""Reads cpkv's flags from an SGLang launch command (both the NSA and the newer CP names)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from pydantic import TypeAdapter, ValidationError

from cpkv_core.config import CpMode
from flags.model import FLAG_SPECS, PHASE_FIELDS, FlagError, FlagSet, field_type
from flags.sources import Layer, ResolvedFlags, cli_layer, merge_layers

CP_STRATEGIES = {"zigzag": CpMode.IN_SEQ_SPLIT, "interleave": CpMode.ROUND_ROBIN_SPLIT}
"""SGLang's ``--cp-strategy`` values to cpkv's split modes."""

SWITCHES: dict[str, str] = {
    **{FLAG_SPECS[f].cli or "": f for f in PHASE_FIELDS.values()},
    "--enable-nsa-prefill-context-parallel": "enable_nsa_prefill_context_parallel",
    "--enable-dsa-prefill-context-parallel": "enable_nsa_prefill_context_parallel",
    "--enable-prefill-context-parallel": "enable_nsa_prefill_context_parallel",
    "--enable-prefill-cp": "enable_nsa_prefill_context_parallel",
    "--enable-kv-cache-sharding": "enable_nsa_prefill_cp_shared_kv",
}
"""Boolean SGLang arguments (``store_true``) and the field each turns on."""

LEGACY_CP_SWITCHES = frozenset(
    {
        "--enable-nsa-prefill-context-parallel",
        "--enable-dsa-prefill-context-parallel",
        "--enable-prefill-context-parallel",
    }
)
"""CP switches from before ``--attn-cp-size``: the CP size was the attention TP size."""

VALUED: dict[str, str] = {
    "--nsa-prefill-cp-mode": "nsa_prefill_cp_mode",
    "--dsa-prefill-cp-mode": "nsa_prefill_cp_mode",
    "--cp-strategy": "nsa_prefill_cp_mode",
    "--attn-cp-size": "attn_cp_size",
    "--page-size": "page_size",
    "--nsa-prefill-cp-min-tokens": "nsa_prefill_cp_min_tokens",
    "--disaggregation-mode": "disaggregation_mode",
    "--disaggregation-transfer-backend": "disaggregation_transfer_backend",
    "--disaggregation-decode-cp-size": "disaggregation_decode_cp_size",
}
"""SGLang arguments that take a value, and the field each sets."""

_SIZES = {
    "--tp": "tp",
    "--tp-size": "tp",
    "--tensor-parallel-size": "tp",
    "--dp": "dp",
    "--dp-size": "dp",
    "--data-parallel-size": "dp",
}
_ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True, slots=True)
class SglangImport:
    """What an SGLang launch command says about cpkv's flags."""

    resolved: ResolvedFlags
    """The flags (defaults overlaid by the command) with ``sglang:ARG`` provenance."""
    ignored: tuple[str, ...]
    """Tokens cpkv does not read (the program, the model path, unrelated options)."""
    ignored_at: tuple[int, ...] = ()
    """The position of each ignored token in ``shlex.split(args)``, so that another reader
    (``cpkv plan --from-sglang``) can tell which of them it reads."""

    @property
    def flags(self) -> FlagSet:
        """The imported flag set."""
        return self.resolved.flags


def from_sglang(args: str) -> tuple[FlagSet, list[str]]:
    """The flag set an SGLang launch command describes, and the arguments it ignored.

    Raises:
        FlagError: a cpkv-relevant argument has a bad or missing value.
    """
    imported = read_sglang(args)
    return imported.flags, list(imported.ignored)


def read_sglang(args: str) -> SglangImport:
    """Like :func:`from_sglang`, keeping provenance and notes.

    Reads ``--flag value`` and ``--flag=value``; leading ``NAME=value`` environment
    assignments for cpkv's environment variables (``SGLANG_DEBUG_CP_SHARED_KV=1 python
    -m sglang.launch_server ...``). When CP is on through a legacy switch (``--enable-nsa-
    prefill-context-parallel`` and its DSA aliases) without ``--attn-cp-size``, the CP size
    is SGLang's attention TP size then: ``--tp``, divided by ``--dp`` under
    ``--enable-dp-attention``. Otherwise ``--tp``/``--dp`` are reported as ignored.
    """
    try:
        tokens = shlex.split(args)
    except ValueError as exc:
        raise FlagError(f"--from-sglang: cannot split the command line: {exc}") from exc
    reader = _Reader(tokens)
    notes = reader.read()
    flags, sources = merge_layers(reader.layer)
    resolved = ResolvedFlags(flags, sources, notes=tuple(notes))
    ignored = sorted(reader.ignored)
    return SglangImport(
        resolved, tuple(token for _, token in ignored), tuple(i for i, _ in ignored)
    )


class _Reader:
    """One pass over the tokens, collecting a layer of values and the ignored tokens."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.layer: Layer = {}
        self.ignored: list[tuple[int, str]] = []
        self.size_tokens: list[tuple[int, str]] = []
        self.sizes: dict[str, int] = {}
        self.dp_attention = False
        self.cp_switch = ""

    def read(self) -> list[str]:
        """Reads every token; returns notes on inferred values."""
        env_names = {spec.env: name for name, spec in FLAG_SPECS.items()}
        i = 0
        while i < len(self.tokens) and _ENV_ASSIGNMENT.match(self.tokens[i]):
            name, _, value = self.tokens[i].partition("=")
            if name in env_names:
                self._set(env_names[name], value, f"sglang:{name}", env_only_ok=True)
            else:
                self.ignored.append((i, self.tokens[i]))
            i += 1
        while i < len(self.tokens):
            i = self._option(i)
        notes = self._infer_cp_size()
        if not notes:
            self.ignored += self.size_tokens
        return notes

    def _option(self, i: int) -> int:
        token = self.tokens[i]
        arg, eq, inline = token.partition("=")
        if arg in SWITCHES:
            self._set(SWITCHES[arg], inline if eq else "true", f"sglang:{arg}")
            if SWITCHES[arg] == "enable_nsa_prefill_context_parallel":
                self.cp_switch = arg
            return i + 1
        if arg == "--enable-dp-attention":
            self.dp_attention = not eq or _truthy(arg, inline)
            self.size_tokens.append((i, token))
            return i + 1
        if arg not in VALUED and arg not in _SIZES:
            self.ignored.append((i, token))
            return i + 1
        if eq:
            value = inline
        elif i + 1 < len(self.tokens):
            value = self.tokens[i + 1]
        else:
            raise FlagError(f"--from-sglang: {arg} needs a value")
        if arg in _SIZES:
            self.sizes[_SIZES[arg]] = _int(arg, value)
            self.size_tokens += [(j, self.tokens[j]) for j in range(i, i + (1 if eq else 2))]
        else:
            self._valued(arg, value)
        return i + (1 if eq else 2)

    def _valued(self, arg: str, value: str) -> None:
        if arg == "--cp-strategy":
            if value not in CP_STRATEGIES:
                choices = ", ".join(CP_STRATEGIES)
                raise FlagError(
                    f"--from-sglang: --cp-strategy must be one of {choices}, got {value!r}"
                )
            self.layer[VALUED[arg]] = (CP_STRATEGIES[value], f"sglang:{arg}")
            return
        self._set(VALUED[arg], value, f"sglang:{arg}")

    def _set(self, name: str, raw: object, source: str, env_only_ok: bool = False) -> None:
        try:
            if env_only_ok and FLAG_SPECS[name].env_only:
                layer = _env_only_layer(name, raw, source)
            else:
                layer = cli_layer({name: raw}, source)
        except FlagError as exc:
            raise FlagError(f"--from-sglang: {source.removeprefix('sglang:')}: {exc}") from exc
        self.layer.update(layer)

    def _infer_cp_size(self) -> list[str]:
        cp_on = self.layer.get("enable_nsa_prefill_context_parallel", (False, ""))[0]
        legacy = self.cp_switch in LEGACY_CP_SWITCHES
        if not (cp_on and legacy) or "attn_cp_size" in self.layer or "tp" not in self.sizes:
            return []
        tp = self.sizes["tp"]
        dp = self.sizes.get("dp", 1) if self.dp_attention else 1
        size = max(tp // max(dp, 1), 1)
        source = "sglang:--tp/--dp" if self.dp_attention and dp > 1 else "sglang:--tp"
        self.layer["attn_cp_size"] = (size, source)
        return [
            f"attn_cp_size={size} inferred from the attention TP size (tp={tp}, dp={dp}): "
            f"{self.cp_switch} without --attn-cp-size uses it as the CP size"
        ]


def _env_only_layer(name: str, raw: object, source: str) -> Layer:
    try:
        value = TypeAdapter(field_type(name)).validate_python(raw if raw != "" else None)
    except ValidationError as exc:
        raise FlagError(f"{exc.errors()[0]['msg']}, got {raw!r}") from exc
    return {name: (value, source)}


def _truthy(arg: str, value: str) -> bool:
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise FlagError(f"--from-sglang: {arg} takes no value or true/false, got {value!r}")


def _int(arg: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise FlagError(f"--from-sglang: {arg} must be an integer, got {value!r}") from None
