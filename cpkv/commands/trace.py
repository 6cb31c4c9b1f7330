"""``cpkv trace synth``: a trace from a workload through an SGLang-like scheduler.

Exit codes: 0 ok; 2 bad input (an option out of range or for another workload, a malformed
requests file, an unwritable output path).
"""

from __future__ import annotations

import dataclasses
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from cpkv.commands.options import JsonOpt
from cpkv.common.console import BadInput, bad_input_exits, emit, out
from cpkv.synth import (
    PRESETS,
    GspShape,
    RandomShape,
    SchedulerConfig,
    Size,
    Workload,
    check_scheduler,
    effective_scheduler,
    generated_shared_prefix,
    random_prompts,
    read_requests_file,
    summarize,
    synthesize,
    trace_text,
)

app = typer.Typer(name="trace", help="Make traces.", no_args_is_help=True)


class WorkloadName(StrEnum):
    """What ``--workload`` names."""

    CHAT = "chat"
    LONG_DOC = "long-doc"
    AGENT = "agent"
    GSP = "generated-shared-prefix"
    RANDOM = "random"
    REQUESTS = "requests"


_GSP_OPTIONS = {
    "gsp_num_groups": "num_groups",
    "gsp_prompts_per_group": "prompts_per_group",
    "gsp_system_prompt_len": "system_prompt_len",
    "gsp_question_len": "question_len",
    "gsp_range_ratio": "range_ratio",
}
_RANDOM_OPTIONS = {
    "num_prompts": "num_prompts",
    "random_input_len": "input_len",
    "random_range_ratio": "range_ratio",
}

IntOpt = int | None
FloatOpt = float | None


def _only_for(workload: WorkloadName, allowed: WorkloadName, given: dict[str, Any]) -> None:
    names = [f"--{name.replace('_', '-')}" for name, value in given.items() if value is not None]
    if names and workload is not allowed:
        raise BadInput(f"{', '.join(names)} need --workload {allowed}, got --workload {workload}")


def _workload(
    name: WorkloadName, seed: int, size: Size | None, requests: Path | None, shape: dict[str, Any]
) -> tuple[Workload, SchedulerConfig]:
    """The workload and the scheduler settings it brings (a preset's, else SGLang's)."""
    gsp = {_GSP_OPTIONS[k]: v for k, v in shape.items() if k in _GSP_OPTIONS and v is not None}
    rnd = {
        _RANDOM_OPTIONS[k]: v for k, v in shape.items() if k in _RANDOM_OPTIONS and v is not None
    }
    _only_for(name, WorkloadName.GSP, {k: shape[k] for k in _GSP_OPTIONS})
    _only_for(name, WorkloadName.RANDOM, {k: shape[k] for k in _RANDOM_OPTIONS})
    if requests is not None and name is not WorkloadName.REQUESTS:
        raise BadInput(f"--requests needs --workload requests, got --workload {name}")
    presets = {n for n, _ in PRESETS}
    if size is not None and name not in presets:
        raise BadInput(
            f"--size applies to the presets {', '.join(sorted(presets))}; got "
            f"--workload {name}: set its sizes with its own options"
        )
    if name in presets:
        preset = PRESETS[(name, size or Size.FULL)]
        return preset.make(seed), preset.scheduler
    if name is WorkloadName.GSP:
        return generated_shared_prefix(GspShape(**gsp), seed), SchedulerConfig()
    if name is WorkloadName.RANDOM:
        return random_prompts(RandomShape(**rnd), seed), SchedulerConfig()
    if requests is None:
        raise BadInput("--workload requests needs --requests PATH (one request a line)")
    return read_requests_file(requests), SchedulerConfig()


@app.command("synth")
def synth_command(
    workload: Annotated[
        WorkloadName,
        typer.Option(
            "--workload",
            help="A preset, a bench_serving shape, or 'requests' (a JSONL file, --requests).",
        ),
    ],
    out_path: Annotated[Path, typer.Option("--out", help="Trace file to write.")],
    seed: Annotated[int, typer.Option("--seed", help="Random seed; same seed, same bytes.")] = 1,
    size: Annotated[
        Size | None, typer.Option("--size", help="Preset size: full, or small for CPU runs.")
    ] = None,
    requests: Annotated[
        Path | None, typer.Option("--requests", help="Per-request JSONL for --workload requests.")
    ] = None,
    page_size: Annotated[int, typer.Option("--page-size", help="Tokens per KV page.")] = 64,
    chunked_prefill_size: Annotated[
        IntOpt,
        typer.Option(
            "--chunked-prefill-size",
            help="Tokens per chunk; -1 off (default: preset's, else 8192).",
        ),
    ] = None,
    max_prefill_tokens: Annotated[
        IntOpt,
        typer.Option(
            "--max-prefill-tokens", help="Token budget per batch (default: preset's, else 16384)."
        ),
    ] = None,
    max_concurrency: Annotated[
        IntOpt,
        typer.Option("--max-concurrency", help="Sessions in flight (default: the workload's)."),
    ] = None,
    kv_cache_sharding: Annotated[
        bool,
        typer.Option(
            "--enable-kv-cache-sharding",
            help="Schedule as a KV-sharded server: the chunk size rounds up to a page "
            "multiple and every chunk starts on a page boundary.",
        ),
    ] = False,
    gsp_num_groups: Annotated[IntOpt, typer.Option(help="Groups (default: 64).")] = None,
    gsp_prompts_per_group: Annotated[
        IntOpt, typer.Option(help="Prompts per group (default: 16).")
    ] = None,
    gsp_system_prompt_len: Annotated[
        IntOpt, typer.Option(help="System prompt (default: 2048).")
    ] = None,
    gsp_question_len: Annotated[
        IntOpt, typer.Option(help="Question tokens (default: 128).")
    ] = None,
    gsp_range_ratio: Annotated[
        FloatOpt, typer.Option(help="Length range ratio (default: 1.0).")
    ] = None,
    num_prompts: Annotated[IntOpt, typer.Option(help="random: prompts (default: 1000).")] = None,
    random_input_len: Annotated[
        IntOpt, typer.Option(help="random: longest prompt (default: 1024).")
    ] = None,
    random_range_ratio: Annotated[
        FloatOpt, typer.Option(help="random: shortest share (default: 0).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Write a trace: the workload's requests through an SGLang-like scheduler (radix-cache
    hits, chunked prefill, a token budget per batch). Prints what the scheduler did."""
    shape = {
        "gsp_num_groups": gsp_num_groups,
        "gsp_prompts_per_group": gsp_prompts_per_group,
        "gsp_system_prompt_len": gsp_system_prompt_len,
        "gsp_question_len": gsp_question_len,
        "gsp_range_ratio": gsp_range_ratio,
        "num_prompts": num_prompts,
        "random_input_len": random_input_len,
        "random_range_ratio": random_range_ratio,
    }
    with bad_input_exits():
        chosen, scheduler = _workload(workload, seed, size, requests, shape)
        overrides = {
            "chunked_prefill_size": chunked_prefill_size,
            "max_prefill_tokens": max_prefill_tokens,
        }
        scheduler = scheduler.model_copy(
            update={"page_size": page_size, "kv_cache_sharding": kv_cache_sharding}
            | {k: v for k, v in overrides.items() if v is not None}
        )
        check_scheduler(scheduler)
        asked, scheduler = scheduler.chunked_prefill_size, effective_scheduler(scheduler)
        if max_concurrency is not None:
            if max_concurrency < 1:
                raise BadInput(f"--max-concurrency must be >= 1, got {max_concurrency}")
            chosen = dataclasses.replace(chosen, max_concurrency=max_concurrency)
        batches = synthesize(chosen, scheduler)
        try:
            out_path.write_text(trace_text(batches), encoding="utf-8")
        except OSError as exc:
            raise BadInput(f"{out_path}: cannot write the trace ({exc.strerror})") from None
    document = {
        "out": str(out_path),
        "workload": str(workload),
        "size": str(size or Size.FULL) if workload in {n for n, _ in PRESETS} else None,
        "seed": seed,
        "scheduler": scheduler.model_dump(),
        "chunked_prefill_size_given": asked,
        "max_concurrency": chosen.max_concurrency,
        **summarize(batches, page_size).to_json(),
    }
    emit(as_json, document, lambda: _render(document))


def _render(document: dict[str, Any]) -> None:
    sched = document["scheduler"]
    if sched["chunked_prefill_size"] != document["chunked_prefill_size_given"]:
        out.print(
            f"note: chunked prefill size rounded up from {document['chunked_prefill_size_given']}"
            f" to {sched['chunked_prefill_size']} (a multiple of page {sched['page_size']}) "
            "for KV sharding, as SGLang 0.5.23 does",
            highlight=False,
            markup=False,
        )
    out.print(
        f"wrote {document['out']}: {document['batches']} batches, {document['requests']} "
        f"requests, {document['computed_tokens']:,} tokens computed + "
        f"{document['cached_tokens']:,} from the radix cache "
        f"({document['cache_hit_share']:.0%} of {document['prompt_tokens']:,} prompt tokens); "
        f"{document['continued_chunks']} continued chunks, {document['mid_page_resumes']} "
        f"resume mid-page; page {sched['page_size']}, chunk {sched['chunked_prefill_size']}, "
        f"batch budget {sched['max_prefill_tokens']}",
        highlight=False,
        markup=False,
    )


def register(main: typer.Typer) -> None:
    """Adds the ``trace`` group (``cpkv trace synth``) to ``main``."""
    main.add_typer(app)
