"""Random SGLang 0.5.23 launch commands of the kind operators write, for checking cpkv's reader
against SGLang's own resolution on commands nobody wrote by hand.

Each command is a prefill-CP base (a model of ``tests/data/models``, a launcher form, a TP
size, CP and KV-sharding options) and one to six extras drawn from what operators add:
quantization, context length, EPLB and expert dispatch, LM-head layouts, model overrides,
PD roles, speculative decoding, HiCache and serving knobs that resolve nothing. The same
seed draws the same commands: seeds 41 and 42, 250 each, drew most of
``tests/data/sglang_corpus_operator.jsonl``. Resolve them with SGLang, then compare with
``tests/test_sglang_corpus.py``:

    .venv/bin/python scripts/sglang_random_commands.py --count 200 --seed 7 > cmds.jsonl
    .venv/bin/python scripts/sglang_oracle.py cmds.jsonl verdicts.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
from collections.abc import Callable

MODELS = (
    "deepseek-ai/DeepSeek-V3.2",
    "deepseek-ai/DeepSeek-V3.2",
    "zai-org/GLM-5",
    "zai-org/GLM-5-FP8",
    "deepseek-ai/DeepSeek-V3",
    "deepseek-ai/DeepSeek-R1",
    "moonshotai/Kimi-K2-Instruct",
    "tests/data/models/local/v32-finetune",
    "tests/data/models/local/dsv3-finetune",
    "tests/data/models/local/glm5-kpool4",
    "tests/data/models/local/kimi-k25-text-config",
    "tests/data/models/local/hyv4-dsa",
    "Qwen/Qwen3-8B",
)
LAUNCHERS = (
    "python -m sglang.launch_server",
    "python3 -m sglang.launch_server",
    "sglang serve",
    "python3 -u -m sglang.launch_server",
)
BOOLEAN_VALUES = ("1", "0", "true", "false", "y", "n", "yes", "no", "on", "off", "TRUE")
"""SGLang's boolean spellings, and two it ignores (``on``, ``off``)."""
OVERRIDES = (
    {"index_topk": 1024},
    {"max_position_embeddings": 262144},
    {"num_nextn_predict_layers": 0},
    {"architectures": ["DeepseekV3ForCausalLMNextN"]},
    {"quantization_config": {"quant_method": "fp8"}},
)

Draw = Callable[[random.Random], list[str]]


def _one(*values: object) -> Callable[[random.Random], str]:
    return lambda rng: str(rng.choice(values))


EXTRAS: tuple[Draw, ...] = (
    lambda rng: ["--trust-remote-code"],
    lambda rng: ["--host", "0.0.0.0", "--port", _one(30000, 8000)(rng)],
    lambda rng: ["--served-model-name", "prod-model"],
    lambda rng: ["--context-length", _one(4096, 32768, 131072, 163840, 202752, 262144)(rng)],
    lambda rng: [
        "--quantization",
        _one(
            "fp8",
            "w4afp8",
            "modelopt_fp4",
            "modelopt_fp8",
            "modelopt",
            "nvfp4_online",
            "quark_mxfp4",
            "humming",
            "w8a8_fp8",
            "awq",
            "mxfp4",
            "unquant",
        )(rng),
    ],
    lambda rng: ["--enable-metrics"],
    lambda rng: ["--log-level", _one("info", "warning")(rng)],
    lambda rng: ["--max-total-tokens", _one(200000, 1000000)(rng)],
    lambda rng: ["--cuda-graph-max-bs", _one(8, 32, 64, 128, 256)(rng)],
    lambda rng: ["--disable-cuda-graph"],
    lambda rng: ["--enable-torch-compile"],
    lambda rng: ["--mem-fraction-static", _one("0.8", "0.85", "0.9", "0.92")(rng)],
    lambda rng: ["--chunked-prefill-size", _one(-1, 2048, 4096, 4097, 8192, 16384)(rng)],
    lambda rng: ["--max-running-requests", _one(64, 128, 256)(rng)],
    lambda rng: ["--enable-dp-attention", "--dp", _one(2, 4, 8)(rng)],
    lambda rng: ["--dp-size", _one(2, 4, 8)(rng)],
    lambda rng: ["--ep", _one(8, 16)(rng)],
    lambda rng: ["--moe-a2a-backend", _one("deepep", "none", "mooncake")(rng)],
    lambda rng: ["--deepep-mode", _one("auto", "normal", "low_latency")(rng)],
    lambda rng: ["--enable-eplb", "--ep-num-redundant-experts", "32"],
    lambda rng: ["--ep-dispatch-algorithm", _one("static", "dynamic", "lp", "fake")(rng)],
    lambda rng: ["--init-expert-location", _one("trivial", "random")(rng)],
    lambda rng: ["--moe-runner-backend", _one("auto", "triton", "flashinfer_trtllm")(rng)],
    lambda rng: [
        "--speculative-algorithm",
        _one("EAGLE", "NEXTN", "EAGLE3")(rng),
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "4",
    ],
    lambda rng: ["--disable-radix-cache"],
    lambda rng: ["--enable-hierarchical-cache", "--hicache-ratio", "2"],
    lambda rng: ["--enable-mixed-chunk"],
    lambda rng: [
        "--attention-backend",
        _one("dsa", "flashmla", "fa3", "triton", "trtllm_mla", "flashinfer")(rng),
    ],
    lambda rng: ["--dsa-prefill-backend", _one("flashmla_sparse", "flashmla_kv", "trtllm")(rng)],
    lambda rng: ["--dsa-decode-backend", _one("flashmla_kv", "fa3", "trtllm", "tilelang")(rng)],
    lambda rng: [
        "--disaggregation-mode",
        _one("prefill", "decode")(rng),
        "--disaggregation-transfer-backend",
        _one("mooncake", "nixl")(rng),
    ],
    lambda rng: ["--dcp-size", _one(2, 4, 8)(rng)],
    lambda rng: ["--pp-size", _one(2, 4)(rng)],
    lambda rng: ["--enable-two-batch-overlap"],
    lambda rng: ["--enable-dp-lm-head"],
    lambda rng: ["--enable-dp-lm-head", "--attn-dp-size", _one(2, 8)(rng)],
    lambda rng: ["--enable-tp-lm-head-all-to-all"],
    lambda rng: ["--load-format", "dummy"],
    lambda rng: ["--tool-call-parser", "deepseekv32", "--reasoning-parser", "deepseek-v3"],
    lambda rng: ["--cpu-offload-gb", "10"],
    lambda rng: ["--enable-dsa-cache-layer-split"],
    lambda rng: ["--json-model-override-args", json.dumps(rng.choice(OVERRIDES))],
    lambda rng: ["--skip-server-warmup", "--watchdog-timeout", "600"],
)
"""What operators add to a base command, one draw each."""


def _base(rng: random.Random) -> list[str]:
    tp = rng.choice((1, 2, 4, 8, 8, 8, 16))
    args = ["--model-path" if rng.random() < 0.8 else "--model", rng.choice(MODELS)]
    args += [rng.choice(("--tp", "--tp-size", "--tensor-parallel-size")), str(tp)]
    if tp == 16 or rng.random() < 0.05:
        args += ["--nnodes", "2", "--node-rank", _one(0, 1)(rng)]
        args += ["--dist-init-addr", "10.0.0.1:5000"]
    if rng.random() < 0.6:
        args.append("--enable-prefill-cp")
        if rng.random() < 0.7:
            args += ["--cp-strategy", _one("zigzag", "interleave")(rng)]
        if rng.random() < 0.3:
            args += ["--attn-cp-size", _one(2, 4, 8)(rng)]
    if rng.random() < 0.3:
        args.append("--enable-kv-cache-sharding")
    if rng.random() < 0.2:
        args += ["--page-size", _one(1, 16, 32, 64, 128)(rng)]
    if rng.random() < 0.25:
        args += ["--kv-cache-dtype", _one("auto", "fp8_e4m3", "bf16", "fp8_e5m2")(rng)]
    return args


def command(rng: random.Random) -> str:
    """One launch command: leading environment assignments, a launcher, a base, extras."""
    env = []
    if rng.random() < 0.1:
        env.append(f"SGLANG_DISAGG_STAGING_BUFFER={rng.choice(BOOLEAN_VALUES)}")
    if rng.random() < 0.08:
        name = rng.choice(("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "SGLANG_IS_IN_CI"))
        env.append(f"{name}={rng.choice(BOOLEAN_VALUES)}")
    args = _base(rng)
    for extra in rng.sample(EXTRAS, rng.randint(1, 6)):
        args += extra(rng)
    return " ".join([*env, rng.choice(LAUNCHERS), *map(shlex.quote, args)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    for index in range(args.count):
        row = {"id": f"op-s{args.seed}-{index:03d}", "class": "operator", "command": command(rng)}
        print(json.dumps(row))


if __name__ == "__main__":
    main()
