"""``scripts/sglang_random_commands.py``: operator-style launch commands, the same for a seed."""

from __future__ import annotations

import random
import shlex
from types import ModuleType

import pytest

from flags.sglang.launcher import split_launch
from tests.scripts_loader import load_script


@pytest.fixture(scope="module")
def script() -> ModuleType:
    return load_script("sglang_random_commands")


def test_a_seed_draws_the_same_commands_and_another_seed_others(script: ModuleType) -> None:
    first = [script.command(random.Random(41)) for _ in range(3)]
    again = [script.command(random.Random(41)) for _ in range(3)]
    other = script.command(random.Random(42))
    assert first == again and other != first[0]


def test_every_command_is_a_launch_command_cpkv_splits(script: ModuleType) -> None:
    rng = random.Random(7)
    for _ in range(200):
        text = script.command(rng)
        launch = split_launch(text)
        tokens = shlex.split(text)
        assert "--model-path" in launch.argv or "--model" in launch.argv, text
        assert tokens[len(launch.env)].startswith(("python", "sglang")), text
