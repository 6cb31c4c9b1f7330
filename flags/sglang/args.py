"""cpkv's one reader of SGLang launch commands: :func:`read_sglang`.

A launch command (``[NAME=value ...] python -m sglang.launch_server ARGS`` or ``sglang serve
ARGS``) goes through four steps, each its own module:

1. seed-series and cpkv-only names are translated, with a warning (:mod:`flags.sglang.seed`);
2. SGLang 0.5.23's argparse reads the rest (:mod:`flags.sglang.parser`);
3. SGLang's resolution rules resolve CP, attention DP, page size, PD and KV sharding, and
   report the rules the command breaks (:mod:`flags.sglang.resolve`);
4. the resolved values become cpkv's flags, with ``sglang:...`` provenance (here).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import TypeAdapter, ValidationError

from cpkv_core.config import CpMode
from cpkv_core.mla_presets import PLAN_PRESETS
from flags.checks import Problem
from flags.model import FLAG_SPECS, FlagError, FlagSet, field_type
from flags.sglang.checkpoint import model_overrides
from flags.sglang.launcher import split_launch
from flags.sglang.memory import H200_MIB
from flags.sglang.models import sglang_model
from flags.sglang.parser import ParsedArgs, parse_sglang_argv
from flags.sglang.resolve import SglangResolution, resolve_sglang
from flags.sglang.rules import ARG_GROUPS
from flags.sglang.seed import translate_seed
from flags.sglang.table import SGLANG, SGLANG_VERSION, option_name
from flags.sglang.yaml_config import MergedArgs, merge_config
from flags.sources import Layer, ResolvedFlags, cli_layer, merge_layers

CP_STRATEGIES = {"zigzag": CpMode.IN_SEQ_SPLIT, "interleave": CpMode.ROUND_ROBIN_SPLIT}
"""SGLang's ``--cp-strategy`` values to cpkv's split modes."""

FLAG_DESTS: dict[str, str] = {
    "enable_nsa_prefill_context_parallel": "enable_prefill_cp",
    "nsa_prefill_cp_mode": "cp_strategy",
    "attn_cp_size": "attn_cp_size",
    "page_size": "page_size",
    "enable_nsa_prefill_cp_shared_kv": "enable_kv_cache_sharding",
    "disaggregation_mode": "disaggregation_mode",
    "disaggregation_transfer_backend": "disaggregation_transfer_backend",
}
"""Each cpkv flag an SGLang 0.5.23 option sets, to that option's ``ServerArgs`` field."""

FLAG_OPTIONS = tuple(option_name(dest) for dest in FLAG_DESTS.values())
"""The 0.5.23 options that set cpkv's flags (``--enable-prefill-cp``, ``--cp-strategy``, ...)."""

REPORTED = (
    "model_path",
    "device",
    "tp_size",
    "dp_size",
    "attn_dp_size",
    "attn_cp_size",
    "ep_size",
    "pp_size",
    "dcp_size",
    "dcp_replicate_q_proj",
    "enable_prefill_cp",
    "cp_strategy",
    "page_size",
    "kv_cache_dtype",
    "attention_backend",
    "dsa_prefill_backend",
    "dsa_decode_backend",
    "moe_a2a_backend",
    "enable_kv_cache_sharding",
    "disaggregation_mode",
    "disaggregation_transfer_backend",
    "chunked_prefill_size",
    "mem_fraction_static",
)
"""The resolved ``ServerArgs`` fields ``cpkv flags --json`` shows under ``sglang``."""

RULE_ENV = (
    "SGLANG_DISAGG_STAGING_BUFFER",
    "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND",
    "SGLANG_ENABLE_POST_CAPTURE_KV_SIZING",
    "SGLANG_MOONCAKE_CUSTOM_MEM_POOL",
    "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN",
    "SGLANG_IS_IN_CI",
)
"""Environment variables SGLang's KV-sharding, PD and context-length rules read."""


@dataclass(frozen=True, slots=True)
class SglangImport:
    """What an SGLang launch command says, as SGLang 0.5.23 reads it and as cpkv's flags."""

    resolved: ResolvedFlags
    """cpkv's flags (defaults overlaid by the command) with ``sglang:...`` provenance."""
    sglang: SglangResolution
    """SGLang's own resolution of the command."""
    warnings: tuple[str, ...]
    """Seed-series names read anyway, deprecated options, what cpkv cannot see."""
    unused: dict[str, str]
    """Fields the command sets that neither cpkv's flags nor the rules read, to the option."""
    unused_env: tuple[str, ...] = ()
    """``NAME=value`` assignments cpkv does not read."""
    renamed: dict[str, str] = field(default_factory=dict)
    """0.5.23 option to the seed-series name the command spelled it with."""

    def source_of(self, dest: str) -> str:
        """Where field ``dest`` came from: ``sglang:FILE`` (relative to ``arg_groups/``) of
        the rule that resolved it, ``sglang:OPTION`` as the command gave it, else
        ``default``."""
        return _source(self.sglang, self.renamed, dest)

    @property
    def ignored(self) -> tuple[str, ...]:
        """The options and assignments in :attr:`unused` and :attr:`unused_env`."""
        return (*self.unused.values(), *self.unused_env)

    @property
    def flags(self) -> FlagSet:
        """The imported flag set."""
        return self.resolved.flags

    @property
    def problems(self) -> tuple[Problem, ...]:
        """Every SGLang 0.5.23 start-up rule the command breaks."""
        return self.sglang.problems

    def sglang_json(self) -> dict[str, Any]:
        """``{"version", "model", "resolved", "given", "cp_size"}`` for ``--json``."""
        model = self.sglang.model
        values = self.sglang.values
        return {
            "version": SGLANG_VERSION,
            "model": None if model is None else model.architecture,
            "resolved": {dest: values[dest] for dest in REPORTED}
            | {"attn_tp_size": self.sglang.attn_tp_size},
            "given": dict(self.sglang.given),
            "cp_size": self.sglang.cp_size,
        }


def from_sglang(args: str) -> tuple[FlagSet, list[str]]:
    """The flag set an SGLang launch command describes, and what it ignored.

    Raises:
        FlagError: SGLang's parser refuses the command, or an old name is malformed.
    """
    imported = read_sglang(args)
    return imported.flags, list(imported.ignored)


def read_sglang(args: str, preset: str | None = None, gpu_mib: float = H200_MIB) -> SglangImport:
    """Reads a launch command as SGLang 0.5.23 does (see the module docstring).

    Args:
        args: the command line, as one string.
        preset: a cpkv model preset whose model rules apply instead of ``--model-path``'s.
        gpu_mib: the GPU's memory in MiB, for SGLang's memory defaults (an H200's).

    Raises:
        FlagError: the command does not split, names another program, SGLang's parser
            refuses it (:class:`flags.sglang.parser.SglangArgError`, naming the closest
            option), or a seed-series name is malformed.
    """
    if preset is not None and preset not in PLAN_PRESETS:
        raise FlagError(f"--model must be one of {', '.join(PLAN_PRESETS)}, got {preset!r}")
    launch = split_launch(args)
    env = launch.env
    translated = translate_seed(list(launch.argv))
    merged = merge_config(translated.argv)
    parsed = _config_provenance(parse_sglang_argv(merged.argv, merged.config_options), merged)
    overrides = model_overrides(parsed.values.get("json_model_override_args")) or {}
    model = sglang_model(parsed.values["model_path"], preset, overrides)
    rule_env = {k: env[k] for k in RULE_ENV if k in env}
    resolution = resolve_sglang(parsed, rule_env, model, gpu_mib)
    layer = _resolved_layer(resolution, translated.renamed)
    for name, (raw, source) in translated.extra.items():
        layer.update(cli_layer({name: raw}, source))
    layer.update(_env_layer(env))
    flags, sources = merge_layers(layer)
    warnings = list(translated.warnings) + list(parsed.warnings)
    if merged.config is None and parsed.values.get("config") is not None:
        warnings.append(
            f"--config={parsed.values['config']}: SGLang merges a config file only after the "
            "token --config (space-separated); with '=' it stores the path and reads nothing"
        )
    used = {*FLAG_DESTS.values(), *resolution.read, "model_path"}
    unused = {dest: option for dest, option in resolution.given.items() if dest not in used}
    unused_env = tuple(f"{k}={v}" for k, v in env.items() if not _env_read(k))
    notes = _notes(resolution, translated.renamed)
    return SglangImport(
        ResolvedFlags(flags, sources, notes=tuple(notes)),
        resolution,
        tuple(warnings),
        unused,
        unused_env,
        translated.renamed,
    )


def _config_provenance(parsed: ParsedArgs, merged: MergedArgs) -> ParsedArgs:
    """Names the config file as the source of each field only the file set."""
    if not parsed.from_config:
        return parsed
    given = {
        dest: f"--config {merged.config}: {option}" if dest in parsed.from_config else option
        for dest, option in parsed.given.items()
    }
    return replace(parsed, given=given)


def _source(resolution: SglangResolution, renamed: dict[str, str], dest: str) -> str:
    if dest in resolution.declared:
        return f"sglang:{resolution.declared[dest].removeprefix(ARG_GROUPS)}"
    option = resolution.given.get(dest)
    if option is None:
        return "default"
    return f"sglang:{renamed.get(option, option)}"


def _resolved_layer(resolution: SglangResolution, renamed: dict[str, str]) -> Layer:
    """cpkv's flags from the resolved fields that the command set or a rule resolved."""
    layer: Layer = {}
    for name, dest in FLAG_DESTS.items():
        source = _source(resolution, renamed, dest)
        phase_2 = dest == "enable_kv_cache_sharding"
        if source == "default" or (phase_2 and resolution.cp_size == 1):
            continue
        value = resolution.values[dest]
        if dest == "cp_strategy":
            value = CP_STRATEGIES[value]
        layer.update(cli_layer({name: value}, source))
    return layer


def _env_layer(env: dict[str, str]) -> Layer:
    """cpkv's own environment knobs among the command's assignments."""
    names = {spec.env: name for name, spec in FLAG_SPECS.items()}
    layer: Layer = {}
    for variable, raw in env.items():
        name = names.get(variable)
        if name is None:
            continue
        source = f"sglang:{variable}"
        if not FLAG_SPECS[name].env_only:
            layer.update(cli_layer({name: raw}, source))
            continue
        try:
            value = TypeAdapter(field_type(name)).validate_python(raw if raw != "" else None)
        except ValidationError as exc:
            raise FlagError(f"{variable}: {exc.errors()[0]['msg']}, got {raw!r}") from exc
        layer[name] = (value, source)
    return layer


def _env_read(variable: str) -> bool:
    return variable in RULE_ENV or any(spec.env == variable for spec in FLAG_SPECS.values())


def _notes(resolution: SglangResolution, renamed: dict[str, str]) -> list[str]:
    """A line per reported field a rule resolved to another value than the command's, then
    the resolution's own notes, and what cpkv reads differently."""
    notes = []
    for dest, file in resolution.declared.items():
        value = resolution.values[dest]
        before = resolution.parsed_values.get(dest)
        if dest in REPORTED and value != before:
            was = "unset" if before is None else before
            notes.append(f"{dest} resolves to {value} (command: {was}) by {SGLANG} {file}")
    notes += resolution.notes
    sharding = resolution.values["enable_kv_cache_sharding"]
    if sharding and resolution.cp_size == 1 and not resolution.problems:
        notes.append(
            "--enable-kv-cache-sharding without prefill CP shards over the attention-TP group "
            "(plain-TP MLA); cpkv's phase 2 shards over CP ranks only, so it stays off"
        )
    if "--enable-prefill-cp" in renamed and "cp_strategy" not in resolution.given:
        notes.append(
            "the seed series split in-seq-split (zigzag) by default; 0.5.23 has no "
            "default --cp-strategy"
        )
    return notes
