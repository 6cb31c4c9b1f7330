"""SGLang's forward-batch metadata as cpkv's batch spec: :func:`flags.batch_from_forward_batch`."""

from __future__ import annotations

from enum import IntEnum
from types import SimpleNamespace

import pytest

from cpkv_core.planning.batch import BatchSpec, RequestSpec
from flags import FlagError, batch_from_forward_batch


class SpeculativeAlgorithm(IntEnum):
    NONE = 0
    EAGLE = 1

    def is_none(self) -> bool:
        return self is SpeculativeAlgorithm.NONE


class CaptureHiddenMode(IntEnum):
    NULL = 0
    FULL = 1
    LAST = 2

    def need_capture(self) -> bool:
        return self is not CaptureHiddenMode.NULL


def forward_batch(**overrides: object) -> SimpleNamespace:
    fields: dict[str, object] = {
        "extend_prefix_lens_cpu": [0, 128],
        "extend_seq_lens_cpu": [300, 40],
        "return_logprob": False,
        "spec_algorithm": SpeculativeAlgorithm.NONE,
        "capture_hidden_mode": CaptureHiddenMode.NULL,
    }
    return SimpleNamespace(**(fields | overrides))


def test_builds_batch_spec_with_generated_rids() -> None:
    assert batch_from_forward_batch(forward_batch(), batch_index=7) == BatchSpec(
        7, (RequestSpec("r0", 0, 300), RequestSpec("r1", 128, 40)), None
    )


def test_uses_rids_when_present() -> None:
    spec = batch_from_forward_batch(forward_batch(rids=["a", "b"]))
    assert [r.rid for r in spec.requests] == ["a", "b"]


@pytest.mark.parametrize(
    ("algorithm", "name"),
    [
        (None, None),
        (SpeculativeAlgorithm.NONE, None),
        (SpeculativeAlgorithm.EAGLE, "EAGLE"),
        ("EAGLE3", "EAGLE3"),
        ("NONE", None),
    ],
)
def test_reads_the_speculative_algorithm(algorithm: object, name: str | None) -> None:
    assert batch_from_forward_batch(forward_batch(spec_algorithm=algorithm)).spec == name


@pytest.mark.parametrize(
    ("mode", "captured"),
    [
        (None, False),
        (CaptureHiddenMode.NULL, False),
        (CaptureHiddenMode.LAST, True),
        ("FULL", True),
        ("null", False),
        (SimpleNamespace(name="FULL"), True),
    ],
)
def test_reads_capture_hidden_mode(mode: object, captured: bool) -> None:
    spec = batch_from_forward_batch(forward_batch(capture_hidden_mode=mode))
    assert all(r.capture_hidden is captured for r in spec.requests)


def test_return_logprob_applies_to_every_request() -> None:
    spec = batch_from_forward_batch(forward_batch(return_logprob=True))
    assert all(r.return_logprob for r in spec.requests)


def test_missing_optional_fields_mean_off() -> None:
    fb = SimpleNamespace(extend_prefix_lens_cpu=[0], extend_seq_lens_cpu=[5])
    assert batch_from_forward_batch(fb) == BatchSpec(0, (RequestSpec("r0", 0, 5),))


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"extend_prefix_lens_cpu": None}, "extend_prefix_lens_cpu is missing"),
        ({"extend_seq_lens_cpu": [1]}, "has 2 entries but extend_seq_lens_cpu has 1"),
        ({"extend_seq_lens_cpu": [3, 0]}, "request 'r1' needs .* extend_len=0"),
        ({"rids": ["a", "a"]}, "rids must be 2 distinct ids"),
    ],
)
def test_rejects_malformed_forward_batches(overrides: dict[str, object], match: str) -> None:
    with pytest.raises(FlagError, match=match):
        batch_from_forward_batch(forward_batch(**overrides))
