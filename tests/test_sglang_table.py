"""SGLang 0.5.23's option table: equal to what the pinned wheel declares, and the options
cpkv's rules rely on are in it."""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

import pytest

from flags.sglang.seed import CPKV_ONLY, SEED_NAMES
from flags.sglang.table import TABLE_PATH, OptionKind, option_by_dest, sglang_options
from tests.scripts_loader import load_script


def _generator() -> ModuleType:
    return load_script("sglang_flag_table")


def _wheel(generator: ModuleType) -> Path:
    wheel: Path | None = generator.find_wheel()
    if wheel is None:
        if os.environ.get("CI") == "true":
            pytest.fail("no sglang 0.5.23 wheel in .whl/: scripts/setup.sh downloads it")
        pytest.skip("no sglang 0.5.23 wheel in .whl/ (run scripts/setup.sh)")
    return wheel


def test_the_table_is_what_the_pinned_wheel_declares() -> None:
    generator = _generator()
    expected = generator.dump_table(generator.read_wheel_table(_wheel(generator)))
    assert TABLE_PATH.read_text() == expected, (
        f"{TABLE_PATH.name} drifted from the sglang wheel: python scripts/sglang_flag_table.py"
    )


def test_the_table_holds_the_cp_options_with_their_aliases_and_choices() -> None:
    options = option_by_dest()
    assert options["attn_cp_size"].options == (
        "--attn-cp-size",
        "--attention-context-parallel-size",
    )
    assert options["attn_dp_size"].options == ("--attn-dp-size", "--attention-data-parallel-size")
    assert options["cp_strategy"].choices == ("zigzag", "interleave")
    assert {"mooncake_tcp", "mori"} <= set(options["disaggregation_transfer_backend"].choices or ())
    assert options["enable_kv_cache_sharding"].kind is OptionKind.STORE_TRUE
    assert options["enable_dp_attention"].kind is OptionKind.DEPRECATED_STORE_TRUE
    assert options["model_path"].required and len(sglang_options()) == 532


@pytest.mark.parametrize("name", sorted({*SEED_NAMES, *CPKV_ONLY}))
def test_no_seed_name_is_an_option_or_a_prefix_of_one(name: str) -> None:
    """A seed name SGLang 0.5.23 would read (even as a prefix) must not be translated."""
    every = [o for option in sglang_options() for o in option.options]
    assert not any(o.startswith(name) for o in every), name
