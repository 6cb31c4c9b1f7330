"""PD throughput with real KV row widths: the bench's PD figure on the tiny model widened to
DeepSeek-V3.2's per-layer rows (latent 512 + rope 64, index K 128), 2 layers.

The tiny test vehicle's rows are 228 B per layer, so its PD pieces are latency-bound; this
asks how the packed, streamed sender does when pieces are MiBs (docs/pd.md#throughput).

    .venv/bin/python scripts/pd_wide_rows.py --cp-size 1
"""

from __future__ import annotations

import argparse
import json

from cpkv.bench_pd import bench_pd
from cpkv.builtin_trace import demo_trace
from cpkv_core.config import DeploymentConfig, model_preset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cp-size", type=int, default=4)
    parser.add_argument("--page-size", type=int, default=64)
    args = parser.parse_args()
    wide = model_preset("tiny").model_copy(
        update={
            "name": "tiny-wide-rows",
            "kv_lora_rank": 512,
            "qk_rope_head_dim": 64,
            "index_head_dim": 128,
        }
    )
    deploy = DeploymentConfig(cp_size=args.cp_size, page_size=args.page_size)
    figure = bench_pd(wide, deploy, demo_trace(args.page_size).batches, (0, 2, 5))
    print(json.dumps(figure.to_json(), indent=2))


if __name__ == "__main__":
    main()
