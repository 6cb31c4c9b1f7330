"""The PD figure of ``cpkv bench`` alone, at any CP size: the send path, the large-write
baseline and the ceiling (every rank writing its share at once), as JSON.

The whole bench takes minutes on two cores; this is the figure to re-measure on a host with
a core per rank (docs/pd.md#throughput-cpkv-bench), e.g.

    .venv/bin/python scripts/pd_figure.py --cp-size 4
    .venv/bin/python scripts/pd_figure.py --cp-size 8 --sync
"""

from __future__ import annotations

import argparse
import json
import os

from cpkv.bench.pd import bench_pd
from cpkv.run.builtin_trace import demo_trace
from cpkv_core.config import DeploymentConfig, model_preset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cp-size", type=int, default=4)
    parser.add_argument("--page-size", type=int, default=64)
    parser.add_argument("--sync", action="store_true", help="write on the rank's own thread")
    args = parser.parse_args()
    deploy = DeploymentConfig(cp_size=args.cp_size, page_size=args.page_size)
    batches = demo_trace(args.page_size).batches
    figure = bench_pd(model_preset("tiny"), deploy, batches, (0, 2, 5), overlap=not args.sync)
    doc = figure.to_json() | {"cp_size": args.cp_size, "overlap": not args.sync}
    print(json.dumps(doc | {"cpus": os.cpu_count()}, indent=2))


if __name__ == "__main__":
    main()
