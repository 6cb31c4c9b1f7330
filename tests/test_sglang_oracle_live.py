"""The corpora's verdicts are SGLang 0.5.23's own: ``scripts/sglang_oracle.py`` runs SGLang's
argparse and ``resolve_once()`` again, here, on a sample of every corpus, and gets the
recorded verdict of each.

The sample takes commands of every class of each corpus (launcher forms, YAML files, local
folders, DCP, memory, random draws), so a change to the oracle's platform or to the model
configs that moved SGLang's answer shows here, not only when someone regenerates a corpus.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.sglang_cases import require_sglang

require_sglang()

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
SAMPLE = {
    "sglang_corpus.jsonl": (
        "dsv32-interleave-cp-from-tp",
        "glm5-zigzag-attn-cp4",
        "dsv32-tp16-refused",
        "dsv32-kv-sharding-default-kernels",
    ),
    "sglang_corpus_b.jsonl": (
        "launch-python3-u",
        "launch-serve-config-model",
        "config-glm5-zigzag-attn-cp4",
        "config-underscore-keys",
        "model-local-dsv3-cp",
        "page-dsv3-flashmla",
        "dcp-dsa-decode-worker",
        "attn-tp-dsv32-attn-cp4",
        "env-staging-y-mori",
        "chunk-attn-dp2",
        "mem-kv-sharding-4097",
        "mem-decode-worker",
    ),
    "sglang_corpus_random.jsonl": ("r2-rand-101", "r2-rand-14", "r2-rand-125", "r2-rand-127"),
}
"""Corpus file to the ids of its rows the oracle resolves again."""


def _rows() -> list[dict[str, Any]]:
    rows = []
    for name, ids in SAMPLE.items():
        by_id = {row["id"]: row for row in map(json.loads, (DATA / name).read_text().splitlines())}
        rows += [by_id[row_id] for row_id in ids]
    return rows


@pytest.mark.xdist_group("sglang")
def test_the_oracle_gives_every_recorded_verdict(tmp_path: Path) -> None:
    rows = _rows()
    commands = tmp_path / "commands.jsonl"
    lines = (json.dumps({"id": row["id"], "command": row["command"]}) + "\n" for row in rows)
    commands.write_text("".join(lines))
    out = tmp_path / "verdicts.jsonl"
    oracle = [sys.executable, str(ROOT / "scripts" / "sglang_oracle.py"), str(commands), str(out)]
    subprocess.run(oracle, check=True, capture_output=True, timeout=600)
    verdicts = [json.loads(line)["sglang"] for line in out.read_text().splitlines()]
    for row, verdict in zip(rows, verdicts, strict=True):
        recorded = row["sglang"]
        if recorded["verdict"] == "ok":
            assert verdict["verdict"] == "ok", (row["id"], verdict)
            resolved = {k: verdict["resolved"][k] for k in recorded["resolved"]}
            assert resolved == recorded["resolved"], row["id"]
        else:
            assert verdict["verdict"] == recorded["verdict"], (row["id"], verdict)
            assert verdict.get("where") == recorded.get("where"), (row["id"], verdict)
