"""From a start-up problem to the flags that fix it: :data:`FIELD_FIXES` and :func:`fix`.

The problems are the reader's (``flags.read_sglang``: SGLang 0.5.23's rules) and cpkv's own
(``flags.check_flags``); their codes and values are what this table reads. A problem value
the table knows and finds wrong becomes a :class:`~cpkv.migrate.needs.Need`: the edit that
fixes it and, where the fix changes the deployment, how. A problem with no such value stays
unmet, with why. So a rule the reader changes changes migrate's answer; only the flag each
value maps to is kept here. The key ``*`` answers the whole problem, whatever its values.
"""

from __future__ import annotations

from cpkv.migrate.launch import Edit, EditKind
from cpkv.migrate.needs import (
    FieldFix,
    Need,
    always,
    drop_given,
    set_to,
    switch_on,
    unfixable,
)
from flags import Problem, ProblemCode, SglangImport

C = ProblemCode
CP_ON = (
    "prefill CP on: every prefill chunk is split over the CP ranks, and attention TP drops to "
    "tp / (attention DP x CP)"
)
TRTLLM = (
    "the DSA kernel becomes TRT-LLM's, which SGLang names the Blackwell one ('flashmla_kv on "
    "Hopper, trtllm on Blackwell', sglang/srt/arg_groups/overrides.py): its start-up rules "
    "accept it on Hopper, and cpkv has not run it there"
)
PD_PREFILL = (
    "the server becomes a PD prefill worker: it needs a decode worker (--disaggregation-mode "
    "decode, the same model, KV dtype and transfer backend, no prefill CP) and a PD router in "
    "front of both; it no longer decodes itself"
)
FP8_KV = (
    "KV is stored as fp8_e4m3 instead of {found}: attention reads quantized KV, so the numerics "
    "change (check accuracy before serving), and the decode worker must store fp8_e4m3 too"
)
MOONCAKE = "the KV transfer runs over Mooncake: the decode worker must use Mooncake too"
INTERLEAVE = "the prefill split is interleave, token i to CP rank i % cp (was {found})"
TO_MOONCAKE = set_to("disaggregation_transfer_backend", "mooncake", MOONCAKE)


def _prefill_worker(imported: SglangImport) -> tuple[Edit, ...]:
    if imported.sglang.values["disaggregation_mode"] == "decode":
        return ()
    return (Edit(EditKind.SET, "disaggregation_mode", "prefill"),)


def _cp_size(imported: SglangImport) -> tuple[Edit, ...]:
    values = imported.sglang.values
    cp = values["tp_size"] // max(values["attn_dp_size"], 1)
    return (Edit(EditKind.SET, "attn_cp_size", str(cp)),) if cp > 1 else ()


def _attention_backend(imported: SglangImport) -> tuple[Edit, ...]:
    """A DSA model: SGLang's default (``dsa``); another model: fa3."""
    drops = drop_given("attention_backend", "prefill_attention_backend")(imported)
    model = imported.sglang.model
    if model is not None and model.dsa:
        return drops
    kept = tuple(e for e in drops if e.name != "attention_backend")
    return (*kept, Edit(EditKind.SET, "attention_backend", "fa3"))


def _prefill_cp(imported: SglangImport) -> tuple[Edit, ...]:
    on = Edit(EditKind.SWITCH, "enable_prefill_cp")
    if imported.sglang.values["cp_strategy"] is not None:
        return (on,)
    return (on, Edit(EditKind.SET, "cp_strategy", "interleave"))


def _feature(imported: SglangImport, field: str) -> tuple[Edit, ...]:
    """Drop the feature KV sharding refuses: its variable, its options (speculative decoding:
    all of them), the option itself, or the switch that turns it on (HiCache)."""
    given = imported.sglang.given
    if field.isupper():
        return (Edit(EditKind.UNSET_ENV, field),)
    if field.startswith("speculative_") or field == "enable_multi_layer_eagle":
        family = [d for d in given if d.startswith("speculative_") or d == field]
        return tuple(Edit(EditKind.DROP, d) for d in family)
    if field in given:
        return (Edit(EditKind.DROP, field),)
    if field.startswith("hicache_"):
        family = [d for d in given if d.startswith("hicache_")]
        return tuple(Edit(EditKind.DROP, d) for d in ("enable_hierarchical_cache", *family))
    if field == "pp_size":
        return drop_given("enable_dynamic_chunking")(imported)
    return ()


FIELD_FIXES: dict[ProblemCode, dict[str, FieldFix]] = {
    C.SGLANG_KV_SHARDING_PD_PREFILL_ONLY: {
        "disaggregation_mode": FieldFix(
            lambda found, _: found == "prefill",
            _prefill_worker,
            PD_PREFILL,
            why="a PD decode worker keeps whole pages: migrate the prefill worker that feeds it",
            target="prefill",
        ),
    },
    C.SGLANG_KV_SHARDING_DSA_CP: {
        "device": unfixable(lambda v: v == "cuda", "SGLang's DSA KV sharding runs on CUDA only"),
        "enable_prefill_cp": switch_on("enable_prefill_cp", CP_ON),
        "cp_strategy": set_to("cp_strategy", "interleave", INTERLEAVE),
        "attn_cp_size": FieldFix(
            lambda found, _: isinstance(found, int) and found > 1,
            _cp_size,
            why="tp / attention DP is 1: no CP group to shard over; raise --tp-size",
        ),
        "pp_size": set_to("pp_size", "1", "pipeline parallelism off: the TP group holds the model"),
    },
    C.SGLANG_KV_SHARDING_DSA_KERNELS: {
        "dsa_prefill_backend": set_to("dsa_prefill_backend", "trtllm", TRTLLM),
        "dsa_decode_backend": set_to("dsa_decode_backend", "trtllm", TRTLLM),
        "kv_cache_dtype": set_to("kv_cache_dtype", "fp8_e4m3", FP8_KV),
        "page_size": set_to("page_size", "64"),
    },
    C.SGLANG_KV_SHARDING_DSA_TRANSFER: {
        "disaggregation_transfer_backend": TO_MOONCAKE,
        "enable_dsa_cache_layer_split": FieldFix(
            lambda found, _: not found, drop_given("enable_dsa_cache_layer_split")
        ),
        "index_kpool": unfixable(
            lambda v: v == 1, "the checkpoint pools its index keys; SGLang cannot shard them"
        ),
    },
    C.SGLANG_KV_SHARDING_ATTENTION_BACKEND: {"*": always(_attention_backend)},
    C.SGLANG_KV_SHARDING_TRANSFER_BACKEND: {"disaggregation_transfer_backend": TO_MOONCAKE},
    C.SGLANG_KV_SHARDING_LAYOUT: {
        "page_size": FieldFix(
            lambda found, _: isinstance(found, int) and found > 1,
            lambda _: (Edit(EditKind.SET, "page_size", "64"),),
            target="64",
        ),
        "chunked_prefill_size": FieldFix(
            lambda found, _: isinstance(found, int) and found > 0,
            drop_given("chunked_prefill_size"),
            "chunked prefill on, at SGLang's default chunk for this GPU",
        ),
        "enable_prefill_cp": unfixable(lambda v: v is True, "a GQA model needs prefill CP > 1"),
        "attn_cp_size": unfixable(
            lambda v: isinstance(v, int) and v > 1,
            "a GQA model shards over prefill CP > 1 only (cpkv's phases are for MLA models)",
        ),
        "attn_dp_size": unfixable(
            lambda v: v == 1, "MLA without CP shards over plain TP, without attention DP"
        ),
    },
    C.SGLANG_CP_STRATEGY_UNSET: {
        "*": always(lambda _: (Edit(EditKind.SET, "cp_strategy", "interleave"),)),
    },
    C.SGLANG_CP_STRATEGY_UNSUPPORTED: {"cp_strategy": set_to("cp_strategy", "interleave")},
    C.SGLANG_DSA_CACHE_LAYER_SPLIT: {"*": always(drop_given("enable_dsa_cache_layer_split"))},
    C.SGLANG_PD_TRANSFER_BACKEND: {"disaggregation_transfer_backend": TO_MOONCAKE},
    C.SGLANG_DCP: {"*": always(drop_given("dcp_size"), "decode context parallelism off")},
    C.SGLANG_CP_ON_DECODE: {
        "*": always(lambda _: (), why="a decode worker runs no prefill CP: migrate its prefill")
    },
    C.PHASE_WITHOUT_CP: {"*": always(_prefill_cp, CP_ON)},
    C.STARTUP_CONTRACT: {"disaggregation_transfer_backend": TO_MOONCAKE},
}
"""Problem code to the fix of each value its rule checks; values not listed are not fixed.
``SGLANG_KV_SHARDING_FEATURE`` is answered by :func:`_feature`, whatever feature it names."""


def fix(problem: Problem, imported: SglangImport) -> tuple[list[Need], list[str]]:
    """The needs that answer ``problem`` in the command ``imported``, and why a value it
    names has no fix."""
    table = FIELD_FIXES.get(problem.code, {})
    values = dict(problem.values)
    needs: list[Need] = []
    whys: list[str] = []
    if problem.code is C.SGLANG_KV_SHARDING_FEATURE:
        for field, found in values.items():
            edits = _feature(imported, field)
            off = f"{field} off on this worker"
            needs += [_need(e, problem, field, found, off) for e in edits]
            whys += [] if edits else [f"{field}: no flag of the command turns it off"]
        return needs, whys
    for field, entry in table.items():
        found = values.get(field) if field != "*" else next(iter(values.values()), None)
        if field != "*" and (field not in values or entry.wanted(found, imported)):
            continue
        edits = entry.edits(imported) if entry.edits is not None else ()
        if not edits:
            whys.append(entry.why or f"{field}={found}: no flag fixes it")
        deployment = None if entry.deployment is None else entry.deployment.format(found=found)
        name = field if field != "*" else next(iter(values), "")
        needs += [_need(e, problem, name, found, deployment) for e in edits]
    return needs, whys


def _need(edit: Edit, problem: Problem, field: str, found: object, deployment: str | None) -> Need:
    value = found if isinstance(found, str | int | bool) or found is None else str(found)
    return Need(
        edit,
        (str(problem.code),),
        field,
        value,
        problem.detail or problem.hint,
        problem.source or "cpkv",
        deployment,
    )
