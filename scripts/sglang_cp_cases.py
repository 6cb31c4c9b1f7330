"""Write tests/data/sglang_cp_cases.json from SGLang 0.5.23's own CP code: for each batch,
whether the server splits it and how many rows each rank sends into its all-gathers.

SGLang's runtime does not import on a CPU machine (CUDA-only dependencies), so this loads
four files of the unpacked wheel (``srt/layers/cp/base.py``, ``padding.py``, ``zigzag.py``,
``interleave.py``) with their few outside imports stubbed, runs
``ContextParallelStrategy.can_apply``, ``build_metadata``,
``padding.pad_logical_token_to_physical`` and ``gather_kv_cache`` (with a process group that
records the tensor each rank hands the all-gather) on every rank, and writes what it saw.
``tests/test_sglang_split_gate.py`` checks cpkv's rules against the file.

    unzip -q sglang-0.5.23-*.whl -d /tmp/sglang-wheel
    .venv/bin/python scripts/sglang_cp_cases.py /tmp/sglang-wheel
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import random
import sys
import types
from pathlib import Path
from typing import Any

import torch

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "sglang_cp_cases.json"


class _Parallel:
    """What ``sglang.srt.runtime_context.get_parallel()`` answers in one rank."""

    attn_cp_size = 1
    attn_cp_rank = 0
    attn_cp_group: Any = None


class _ExtendMode:
    def is_context_parallel_extend(self, include_draft_extend_v2: bool = False) -> bool:
        return True


class _Recorder:
    """A CP group whose all-gather records the rows this rank sends."""

    def __init__(self) -> None:
        self.sent: list[int] = []

    def all_gather_into_tensor(self, out: torch.Tensor, local: torch.Tensor) -> None:
        self.sent.append(local.shape[0])
        out.zero_()


def _stub(name: str, **attrs: Any) -> None:
    module = types.ModuleType(name)
    module.__path__ = []  # type: ignore[attr-defined]
    for key, value in attrs.items():
        setattr(module, key, value)
    sys.modules[name] = module


def load_cp(wheel: Path, parallel: _Parallel, recorder: _Recorder) -> dict[str, Any]:
    """SGLang's ``srt/layers/cp`` modules from ``wheel`` (unpacked), imports stubbed."""
    packages = (
        "sglang sglang.srt sglang.srt.layers sglang.srt.layers.cp sglang.srt.distributed "
        "sglang.srt.distributed.device_communicators sglang.srt.mem_cache "
        "sglang.srt.model_executor sglang.srt.model_executor.runner_backend_utils "
        "sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph"
    )
    for name in packages.split():
        _stub(name)
    device = types.SimpleNamespace(device="cpu")
    _stub("sglang.srt.runtime_context", get_parallel=lambda: parallel, get_device=lambda: device)
    _stub(
        "sglang.srt.distributed.device_communicators.pynccl_allocator",
        use_symmetric_memory=lambda *a, **k: contextlib.nullcontext(),
    )
    _stub(
        "sglang.srt.layers.dp_attention",
        is_allocation_symmetric=lambda: False,
        attn_cp_all_gather_into_tensor=recorder.all_gather_into_tensor,
    )
    _stub("sglang.srt.mem_cache.memory_pool", KVWriteLoc=None)
    _stub("sglang.srt.model_executor.forward_context", get_token_to_kv_pool=None)
    _stub(
        "sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.context",
        is_in_breakable_cuda_graph=lambda: False,
    )
    modules = {}
    for name in ("base", "padding", "zigzag", "interleave"):
        full = f"sglang.srt.layers.cp.{name}"
        path = wheel / "sglang" / "srt" / "layers" / "cp" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(full, path)
        assert spec is not None and spec.loader is not None, path
        module = importlib.util.module_from_spec(spec)
        sys.modules[full] = module
        spec.loader.exec_module(module)
        modules[name] = module
    return modules


def run_case(
    cp: dict[str, Any], parallel: _Parallel, recorder: _Recorder, case: dict[str, Any]
) -> dict[str, Any]:
    """SGLang's answer for one batch: ``splits`` and, when it does, ``gather_rows``."""
    size, extend, prefix = case["cp_size"], case["extend_lens"], case["prefix_lens"]
    parallel.attn_cp_size = size
    cp["base"].init_cp_strategy(enable_prefill_cp=True, cp_size=size, cp_strategy=case["mode"])
    strategy = cp["base"].get_cp_strategy() if size > 1 else None
    batch = types.SimpleNamespace(
        forward_mode=_ExtendMode(), extend_seq_lens_cpu=list(extend), attn_cp_metadata=None
    )
    if strategy is None or not strategy.can_apply(sum(extend), batch):
        return case | {"splits": False, "gather_rows": None}
    rows = set()
    for rank in range(size):
        parallel.attn_cp_rank = rank
        seqs = [p + e for p, e in zip(prefix, extend, strict=True)]
        meta = strategy.build_metadata(sum(extend), seqs, list(extend))
        cp["padding"].pad_logical_token_to_physical(meta)
        batch.attn_cp_metadata = meta
        recorder.sent.clear()
        strategy.gather_kv_cache(torch.zeros(meta.per_rank_actual_token[rank], 1), batch)
        rows.add(recorder.sent[0])
    assert len(rows) == 1, f"ranks sent different row counts {rows} for {case}"
    return case | {"splits": True, "gather_rows": rows.pop()}


def cases(seed: int) -> list[dict[str, Any]]:
    """Boundaries (2*cp-1, 2*cp; cp-1, cp) at every size, then random batches."""
    rng = random.Random(seed)
    out = []
    for size in (1, 2, 3, 4, 8):
        for mode in ("zigzag", "interleave"):
            for n in sorted({1, size - 1, size, 2 * size - 1, 2 * size, 2 * size + 1} - {0}):
                out.append({"mode": mode, "cp_size": size, "extend_lens": [n], "prefix_lens": [0]})
                out.append(
                    {"mode": mode, "cp_size": size, "extend_lens": [300, n], "prefix_lens": [0, 64]}
                )
    for _ in range(300):
        size, bs = rng.choice((2, 3, 4, 8)), rng.randint(1, 5)
        lengths = (1, 2, 2 * size - 1, 2 * size)
        extend = [rng.choice((*lengths, rng.randint(1, 700))) for _ in range(bs)]
        prefix = [rng.choice((0, 64, 130)) for _ in range(bs)]
        mode = rng.choice(("zigzag", "interleave"))
        out.append({"mode": mode, "cp_size": size, "extend_lens": extend, "prefix_lens": prefix})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path, help="the unpacked sglang==0.5.23 wheel")
    parser.add_argument("--seed", type=int, default=20)
    args = parser.parse_args()
    parallel, recorder = _Parallel(), _Recorder()
    parallel.attn_cp_group = recorder
    cp = load_cp(args.wheel, parallel, recorder)
    results = [run_case(cp, parallel, recorder, case) for case in cases(args.seed)]
    head = '{"sglang": "0.5.23", "source": "srt/layers/cp (base, padding, zigzag, interleave)",'
    lines = ",\n".join(json.dumps(r) for r in results)
    OUT.write_text(f'{head}\n"cases": [\n{lines}\n]}}\n')
    print(f"wrote {OUT}: {len(results)} cases, {sum(r['splits'] for r in results)} split")


if __name__ == "__main__":
    main()
