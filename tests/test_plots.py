"""Plots: every figure file is written, and the numbers drawn equal the JSON figures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cpkv.cli import app
from cpkv.plots import Skip, write_outputs
from cpkv.plots.bench_plots import BENCH_FIGURES
from tests.conftest import DATA

runner = CliRunner()
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
BENCH_PNGS = [
    "bytes-by-batch.png",
    "gate-time.png",
    "pd-bytes-by-rank.png",
    "remap-view-bytes.png",
    "cp-off-step-time.png",
]


def _bench_document() -> dict[str, Any]:
    """A ``cpkv bench --repeats 1 --json`` document of the built-in trace at cp 4."""
    document: dict[str, Any] = json.loads((DATA / "bench.json").read_text())
    return document


def _drawn(out_dir: Path, stem: str) -> dict[str, dict[str, tuple[list[Any], list[float]]]]:
    """``png -> series label -> (x, y)`` as recorded next to the PNGs."""
    record = json.loads((out_dir / f"{stem}.figures.json").read_text())
    return {
        png: {s["label"]: (s["x"], s["y"]) for s in figure["series"]}
        for png, figure in record.items()
    }


def _assert_pngs(out_dir: Path, names: list[str]) -> None:
    assert sorted(p.name for p in out_dir.glob("*.png")) == sorted(names)
    for name in names:
        data = (out_dir / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000, name


def test_bench_figures_plot_the_bench_json_figures(tmp_path: Path) -> None:
    doc = _bench_document()
    written = write_outputs(tmp_path, "bench", {"bench": doc}, BENCH_FIGURES)
    _assert_pngs(tmp_path, [*BENCH_PNGS, "host-plan-time.png"])
    assert json.loads((tmp_path / "bench.json").read_text()) == doc
    assert written.skipped == ()
    drawn = _drawn(tmp_path, "bench")
    rows = sorted(doc["bytes_by_batch"], key=lambda r: (r["batch"], r["level"]))
    parts = drawn["bytes-by-batch.png"]
    for key in ("write", "current_gather", "materialize", "tail"):
        assert parts[key][1] == [row[key] for row in rows]
    assert [sum(p[1][i] for p in parts.values()) for i in range(len(rows))] == [
        row["total"] for row in rows
    ]
    gate = drawn["gate-time.png"]["Gate.decide, every phase enabled"]
    assert gate == (
        [g["bs"] for g in doc["gate"]],
        [g["microseconds_per_batch"] for g in doc["gate"]],
    )
    remaps = drawn["remap-view-bytes.png"]
    for r in doc["remaps"]:
        x, y = remaps[r["remap"]]
        assert y[x.index(r["batch"])] == r["view_bytes"]
    pd = drawn["pd-bytes-by-rank.png"]
    assert {label: y for label, (_, y) in pd.items()} == {
        f"level {row['level']}": row["bytes_by_rank"] for row in doc["pd"]["levels"]
    }
    cp_off = drawn["cp-off-step-time.png"]["CP on / CP off (slowest rank, median)"]
    sizes = doc["cp_off"]["step_time"]["sizes"]
    assert cp_off == ([r["tokens"] for r in sizes], [r["ratio_on_to_off"] for r in sizes])
    figures = {p.name: p.figure for p in written.plots}
    gate_line = figures["gate-time"].axes[0].lines[0]
    assert list(gate_line.get_ydata()) == gate[1]  # the artist drew what was recorded
    bars = [patch.get_height() for patch in figures["pd-bytes-by-rank"].axes[0].patches]
    assert bars == [b / 1024 for row in doc["pd"]["levels"] for b in row["bytes_by_rank"]]


def test_host_plan_figure_draws_the_bench_json_figures(tmp_path: Path) -> None:
    doc = _bench_document()
    written = write_outputs(tmp_path, "bench", {"bench": doc}, BENCH_FIGURES)
    drawn = _drawn(tmp_path, "bench")["host-plan-time.png"]
    history = [row["history_tokens"] for row in doc["host_plan"]]
    assert history == [4096, 32768, 131072]
    assert drawn["microseconds"] == (history, [row["microseconds"] for row in doc["host_plan"]])
    per_page = [row["microseconds_per_page"] for row in doc["host_plan"]]
    assert drawn["microseconds_per_page"] == (history, per_page)
    figure = next(p.figure for p in written.plots if p.name == "host-plan-time")
    assert list(figure.axes[0].lines[0].get_ydata()) == drawn["microseconds"][1]

    without = {k: v for k, v in doc.items() if k != "host_plan"}
    written = write_outputs(tmp_path / "old", "bench", {"bench": without}, BENCH_FIGURES)
    assert [s.name for s in written.skipped] == ["host-plan-time"]  # an older document


def test_plan_out_writes_the_capacity_figure_for_cp_1_to_8(tmp_path: Path) -> None:
    args = ["plan", "--model", "deepseek-v3.2", "--cp-size", "8", "--tp-size", "8"]
    args += ["--gpu-mem-gib", "141"]
    result = runner.invoke(app, [*args, "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    _assert_pngs(tmp_path, ["capacity.png"])
    assert json.loads((tmp_path / "plan.json").read_text()) == json.loads(result.stdout)
    sweep = json.loads((tmp_path / "capacity.json").read_text())
    cp_sizes = [p["cp_size"] for p in sweep["plans"]]
    assert cp_sizes == [1, 2, 4, 8]  # the CP sizes TP 8 allows
    drawn = _drawn(tmp_path, "plan")["capacity.png"]
    for index, (label, (x, y)) in enumerate(drawn.items()):
        assert x == cp_sizes, label
        assert y == [p["levels"][index]["tokens_per_deployment"] for p in sweep["plans"]]
    plan = json.loads(result.stdout)
    assert (
        drawn["levels 2-5: sharded KV, scratch counted"][1][-1]
        == (plan["levels"][1]["tokens_per_deployment"])
    )


def test_explain_out_draws_the_phase_of_every_batch_and_counts_reasons(tmp_path: Path) -> None:
    args = ["explain", str(DATA / "mixed.jsonl"), "--phases", "all", "--cp-size", "2"]
    args += ["--cp-split-gate", "split-anyway"]  # NOTE: the split's reasons, OWNER_MISMATCH too
    result = runner.invoke(app, [*args, "--page-size", "4", "--json", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    _assert_pngs(tmp_path, ["phases-by-batch.png"])
    doc = json.loads(result.stdout)
    assert json.loads((tmp_path / "explain.json").read_text()) == doc
    drawn = _drawn(tmp_path, "explain")["phases-by-batch.png"]
    assert drawn["phase"] == (
        [b["batch"] for b in doc["batches"]],
        [b["phase"] for b in doc["batches"]],
    )
    labels, counts = drawn["fallback reasons"]
    expected = {
        f"{phase}:{code}": n
        for phase, codes in doc["summary"]["reasons_by_phase"].items()
        for code, n in codes.items()
        if code != "DISABLED"
    }
    assert dict(zip(labels, counts, strict=True)) == expected
    assert "3:HAS_HISTORY" in labels and "5:OWNER_MISMATCH" in labels


def test_capacity_figure_draws_the_recorded_series() -> None:
    from cpkv.plan.inputs import PlanInputs
    from cpkv.plots.capacity import capacity_sweep, plot_capacity

    inputs = PlanInputs(model="glm-5", gpu_mem_gib=141.0, cp_size=4, tp_size=8)
    sweep = capacity_sweep(inputs)
    plot = plot_capacity(sweep)
    assert not isinstance(plot, Skip)
    lines = plot.figure.axes[0].lines[:2]
    assert [list(line.get_ydata()) for line in lines] == [list(s.y) for s in plot.series]
    cp_sizes = [p["cp_size"] for p in sweep["plans"]]
    assert [list(line.get_xdata()) for line in lines] == [cp_sizes] * 2
    assert 4 in cp_sizes and set(cp_sizes) <= set(range(1, 9))


@pytest.mark.parametrize("extra", [["--batch", "1"], ["--decision-log"]], ids=["batch", "log"])
def test_explain_out_with_one_batch_or_a_log_is_bad_input_and_writes_nothing(
    tmp_path: Path, extra: list[str]
) -> None:
    """Neither has the every-batch figure ``--out`` draws: refused, not silently dropped."""
    out_dir = tmp_path / "plots"
    args = ["explain", str(DATA / "mixed.jsonl"), "--phases", "all", "--cp-size", "2"]
    result = runner.invoke(app, [*args, "--page-size", "4", *extra, "--out", str(out_dir)])
    assert result.exit_code == 2, result.output
    assert f"drop {extra[0]} or --out" in result.stderr
    assert not out_dir.exists()
