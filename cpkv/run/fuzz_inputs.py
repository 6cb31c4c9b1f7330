"""The inputs ``cpkv fuzz`` draws, as hypothesis strategies (``st`` is
``hypothesis.strategies``, handed in so that hypothesis loads only when fuzzing): trace
text, config files, flag values, SGLang launch commands, forward batches and
``cpkv enable``/``disable`` invocations."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from flags.model import FLAG_SPECS, TOML_KEYS
from flags.sglang.args import FLAG_OPTIONS
from flags.sglang.seed import SEED_NAMES


def values(st: Any) -> Any:
    """Scalars of every JSON/TOML kind, edge cases included."""
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.sampled_from([0, 1, -1, 3, 4, 63, 64, 65, 2**31]),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=12),
        st.sampled_from(["EAGLE", "NONE", "", "a", "b", "zigzag", "mooncake", "prefill"]),
    )


def trace_text(st: Any) -> Any:
    keys = ["rid", "prefix_len", "extend_len", "prefix_from", "return_logprob", "capture_hidden"]
    request = st.dictionaries(st.sampled_from([*keys, "extra"]), values(st), max_size=7)
    lengths = st.fixed_dictionaries(
        {
            "rid": st.sampled_from(["a", "b", "c"]),
            "prefix_len": st.integers(-2, 140),
            "extend_len": st.integers(-1, 140),
        },
        optional={"prefix_from": st.sampled_from(["a", "b", "z", ""])},
    )
    batch = st.fixed_dictionaries(
        {"batch": st.one_of(st.integers(-1, 5), values(st))},
        optional={
            "requests": st.one_of(st.lists(st.one_of(request, lengths), max_size=4), values(st)),
            "spec": values(st),
        },
    )
    line = st.one_of(batch.map(json.dumps), st.text(max_size=40))
    return st.lists(line, max_size=5).map("\n".join)


def toml_text(st: Any) -> Any:
    key = st.one_of(st.sampled_from(sorted(TOML_KEYS)), st.text(max_size=10))
    value = st.one_of(
        values(st).map(json.dumps), st.sampled_from(["[1, 2]", "{a = 1}", "true", "1.5e3"])
    )
    line = st.one_of(
        st.tuples(key, value).map(lambda kv: f'"{kv[0]}" = {kv[1]}'), st.text(max_size=20)
    )
    return st.lists(line, max_size=6).map("\n".join)


def cli_values(st: Any) -> Any:
    names = sorted(n for n, s in FLAG_SPECS.items() if not s.env_only)
    return st.dictionaries(
        st.sampled_from(names), st.one_of(values(st), st.text(max_size=6)), max_size=5
    )


def sglang_args(st: Any) -> Any:
    token = st.one_of(
        st.sampled_from(
            sorted([*FLAG_OPTIONS, *SEED_NAMES, "--tp", "--dp", "--model-path", "python"])
        ),
        st.sampled_from(["1", "0", "-3", "64", "zigzag", "interleave", "x", "true", "'", '"']),
        st.sampled_from(["SGLANG_DEBUG_CP_SHARED_KV=1", "CPKV_MAX_PHASE=9", "CPKV_X=y"]),
        st.text(max_size=8),
    )
    joined = st.lists(token, max_size=8).map(" ".join)
    pairs = st.lists(
        st.tuples(st.sampled_from(sorted([*FLAG_OPTIONS, *SEED_NAMES])), token).map(
            lambda p: f"{p[0]}={p[1]}"
        ),
        max_size=4,
    ).map(" ".join)
    return st.one_of(joined, pairs)


def forward_batch(st: Any) -> Any:
    ints = st.lists(st.one_of(st.integers(-2, 300), values(st)), max_size=4)
    attrs = {
        "extend_prefix_lens_cpu": st.one_of(ints, values(st)),
        "extend_seq_lens_cpu": st.one_of(ints, values(st)),
        "return_logprob": values(st),
        "spec_algorithm": values(st),
        "capture_hidden_mode": values(st),
        "rids": st.one_of(st.lists(values(st), max_size=4), values(st)),
    }
    return st.fixed_dictionaries({}, optional=attrs).map(lambda d: SimpleNamespace(**d))


def phase_change(st: Any) -> Any:
    """``cpkv enable|disable``: a fuzzed phase argument and options, a config file (or none,
    named by ``--config`` or ``$CPKV_CONFIG``) and ``CPKV_*`` environment values."""
    env_names = sorted(spec.env for spec in FLAG_SPECS.values())
    phase = st.one_of(
        st.sampled_from(["1", "2", "3", "4", "5", "0", "6", "-1", "x", "", "3.0", "1e3", "9" * 20]),
        st.text(max_size=4),
    )
    options = st.lists(st.sampled_from(["--with-needs", "--cascade", "--json"]), unique=True)
    env = st.dictionaries(
        st.sampled_from(env_names),
        st.one_of(
            st.sampled_from(["1", "0", "true", "8", "-2", "zigzag", ""]), st.text(max_size=6)
        ),
        max_size=3,
    )
    return st.tuples(
        st.sampled_from(["enable", "disable"]),
        phase,
        options,
        st.one_of(st.none(), toml_text(st)),
        env,
        st.booleans(),
    )
