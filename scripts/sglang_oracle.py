"""SGLang 0.5.23's own verdict on launch commands: its argparse and ``resolve_once()``.

Reads JSON Lines of ``{"id", "command", ...}`` and writes each row back with an ``sglang``
verdict, as ``tests/data/sglang_corpus*.jsonl`` hold them:

- ``{"verdict": "parse_error", "message"}``: SGLang's argparse exits 2, or its launcher or
  ``--config`` merger refuses the command line;
- ``{"verdict": "refused", "error", "message", "where"}``: its resolution raises (``where``
  is the wheel file that raised);
- ``{"verdict": "ok", "resolved": {...}}``: the resolved fields of :data:`FIELDS`.

SGLang's runtime is imported from the environment ``scripts/setup.sh`` builds for the plugin
tests (the pinned wheel without its CUDA dependencies, see ``requirements-sglang.txt``). This
machine is made to look like one H200 node, the platform cpkv's reader models:

- SGLang's own ``override_platform`` with sm90 CUDA facts;
- GPU memory 143,771 MiB (``nvidia-smi``'s ``memory.total`` on an H200), device ``cuda``;
- torch's CUDA queries answer for an sm90 device (SGLang asks torch for the capability);
- a hub name (``deepseek-ai/DeepSeek-V3.2``) is read offline from a Hugging Face cache built
  from ``tests/data/models/ORG/NAME/config.json``, the published configs' fields;
- commands run from the repository's root, so a relative ``--model-path`` or ``--config``
  names the same file for SGLang and for cpkv's tests.

Each command runs in a forked child, so one command's resolution never leaks into the next.

    .venv/bin/python scripts/sglang_oracle.py IN.jsonl OUT.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

from flags.sglang.args import REPORTED

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "tests" / "data" / "models"
H200_MIB = 143771
"""``nvidia-smi --query-gpu=memory.total`` of an H200 (141 GB HBM3e), in MiB."""

FIELDS = (*REPORTED, "model_path")
"""The resolved ``ServerArgs`` fields a verdict records: those ``cpkv flags --json`` shows,
and the model path."""

ATTN_TP = "attn_tp_size"
"""Attention TP size, read from SGLang's resolved parallel view."""


def _pretend_h200() -> None:
    """Make SGLang's platform probes, memory query and device answer as one H200 does."""
    import torch

    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 8
    torch.cuda.get_device_name = lambda device=None: "NVIDIA H200"

    import sglang.srt.arg_groups.serving_hook as serving_hook
    import sglang.srt.utils.common as common
    from sglang.srt.runtime_context import override_platform

    def memory(device: str | None = None) -> int:
        return H200_MIB

    common.get_device_memory_capacity = memory
    for name, module in list(sys.modules.items()):
        if name.startswith("sglang.") and hasattr(module, "get_device_memory_capacity"):
            module.get_device_memory_capacity = memory  # type: ignore[attr-defined]
    serving_hook.get_device = lambda device_id=None: "cuda"  # type: ignore[attr-defined]
    common.get_device = lambda device_id=None: "cuda"
    no = dict.fromkeys(("is_hip", "is_npu", "is_xpu", "is_musa", "is_mps", "has_amx"), False)
    blackwell = ("is_sm100", "is_sm100_or_sm110", "is_sm110", "is_sm120", "is_blackwell")
    override_platform(
        is_cuda=True,
        is_sm90=True,
        is_hopper_with_cuda_12_3=True,
        has_flashinfer=False,
        device_sm=90,
        device_capability=(9, 0),
        **no,
        **dict.fromkeys(blackwell, False),
    ).install()


def _hf_cache(home: Path) -> None:
    """A Hugging Face cache holding each ``tests/data/models/ORG/NAME/config.json``."""
    for config in MODELS.glob("*/*/config.json"):
        org, name = config.parent.parent.name, config.parent.name
        repo = home / "hub" / f"models--{org}--{name}"
        snapshot = repo / "snapshots" / "0"
        snapshot.mkdir(parents=True)
        shutil.copy(config, snapshot / "config.json")
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text("0")


def _import_pipeline() -> None:
    """Import the resolution pipeline and what it imports lazily, once, before forking."""
    import importlib
    import pkgutil

    import sglang.srt.arg_groups as arg_groups
    import sglang.srt.server_args  # noqa: F401

    for module in pkgutil.walk_packages(arg_groups.__path__, "sglang.srt.arg_groups."):
        importlib.import_module(module.name)
    for name in ("sglang.srt.configs.model_config", "sglang.cli.serve", "transformers"):
        importlib.import_module(name)


def _argv(command: str) -> tuple[dict[str, str], list[str], bool]:
    """The environment assignments, SGLang's argv and whether it is ``sglang serve``.

    Split here on its own, not by cpkv's reader, so that the oracle does not inherit a bug of
    the code it checks: the arguments after the ``sglang.launch_server`` module, or after
    ``sglang serve`` through SGLang's own dispatcher normalisation (``cli/serve.py``).
    """
    tokens = shlex.split(command)
    env: dict[str, str] = {}
    while tokens and "=" in tokens[0] and not tokens[0].startswith("-"):
        name, _, value = tokens.pop(0).partition("=")
        env[name] = value
    for index, token in enumerate(tokens):
        if token.endswith("sglang.launch_server"):
            return env, tokens[index + 1 :], False
        if Path(token).name == "sglang" and tokens[index + 1 : index + 2] == ["serve"]:
            from sglang.cli.serve import (
                _extract_model_type_override,
                _normalize_positional_model_path,
            )

            _, argv = _extract_model_type_override(tokens[index + 2 :])
            argv, _ = _normalize_positional_model_path(argv)
            return env, argv, True
    return env, tokens, False


def _where(tb: Any) -> str:
    """The innermost frame inside the wheel's ``sglang/`` package."""
    where = "?"
    for frame in traceback.extract_tb(tb):
        marker = frame.filename.rfind("/sglang/")
        if marker >= 0:
            where = frame.filename[marker + 1 :]
    return where


def _resolve(command: str) -> dict[str, Any]:
    env, argv, serve = _argv(command)
    os.environ.update(env)
    from sglang.srt.server_args import prepare_server_args

    if serve:
        from sglang.cli.utils import try_get_model_path

        if try_get_model_path(argv) is None:
            return {"verdict": "parse_error", "message": "--model-path is required"}
    try:
        server_args = prepare_server_args(argv)
    except SystemExit:
        return {"verdict": "parse_error", "message": "argparse exit 2"}
    except Exception as exc:  # the config merger's ValueError, and others
        return {"verdict": "parse_error", "message": f"{type(exc).__name__}: {exc}"}
    try:
        server_args.resolve_once()
    except Exception as exc:  # any refusal is a verdict
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return {
            "verdict": "refused",
            "error": type(exc).__name__,
            "message": message[:300],
            "where": _where(exc.__traceback__),
        }
    from sglang.srt.arg_groups.overrides import resolving_view

    view = resolving_view(server_args)
    resolved = {k: getattr(view, k, None) for k in FIELDS}
    resolved[ATTN_TP] = _attn_tp(view)
    return {"verdict": "ok", "resolved": json.loads(json.dumps(resolved, default=str))}


def _attn_tp(view: Any) -> int:
    tp, dp, cp = view.tp_size, view.attn_dp_size, view.attn_cp_size
    return int(tp // max(dp, 1) // max(cp, 1))


def _run_child(command: str) -> dict[str, Any]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            verdict = _resolve(command)
        except BaseException as exc:  # report, never hang the parent
            verdict = {"verdict": "oracle_error", "message": f"{type(exc).__name__}: {exc}"}
        with os.fdopen(write, "w") as out:
            out.write(json.dumps(verdict))
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        text = pipe.read()
    os.waitpid(pid, 0)
    return json.loads(text) if text else {"verdict": "oracle_error", "message": "no answer"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("commands", type=Path)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    hf_home = Path(tempfile.mkdtemp(prefix="sglang-oracle-hf-"))
    try:
        return _oracle(args.commands.resolve(), args.out.resolve(), hf_home)
    finally:
        shutil.rmtree(hf_home, ignore_errors=True)


def _oracle(commands: Path, out_path: Path, hf_home: Path) -> int:
    _hf_cache(hf_home)
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_HOME"] = str(hf_home)
    os.chdir(ROOT)
    import logging

    logging.disable(logging.CRITICAL)
    import warnings

    warnings.simplefilter("ignore")
    _import_pipeline()

    _pretend_h200()
    rows = [json.loads(line) for line in commands.read_text().splitlines() if line]
    with out_path.open("w") as out:
        for index, row in enumerate(rows):
            row["sglang"] = _run_child(row["command"])
            out.write(json.dumps(row) + "\n")
            verdict = row["sglang"]["verdict"]
            print(f"{index + 1}/{len(rows)} {row['id']}: {verdict}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
