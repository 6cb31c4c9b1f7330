"""Builds cpkv's host batch metadata from an object shaped like SGLang's ``ForwardBatch``.

Fields read (nothing else, and no tensor):

- ``extend_prefix_lens_cpu``: list[int], tokens per request already in the KV cache;
- ``extend_seq_lens_cpu``: list[int], tokens per request computed in this batch;
- ``return_logprob``: bool, the batch returns logprobs (every request then needs them);
- ``spec_algorithm``: None, a name (``"EAGLE"``; ``"NONE"`` or ``""`` mean none) or an
  object with ``is_none()`` and a ``name`` (SGLang's ``SpeculativeAlgorithm``);
- ``capture_hidden_mode``: None, a name, or an object with ``need_capture()`` or a
  ``name`` (SGLang's ``CaptureHiddenMode``); ``NULL`` means off;
- ``rids`` (optional): request ids in batch order; else ``r0``, ``r1``, ...
"""

from __future__ import annotations

import operator

from cpkv_core.planning import BatchSpec, RequestSpec
from flags.model import FlagError


def batch_from_forward_batch(fb: object, batch_index: int = 0) -> BatchSpec:
    """The :class:`BatchSpec` of an SGLang-style forward batch (see the module docstring).

    ``prefix_from`` is left unset: a forward batch does not say which request a
    radix-cache prefix came from.

    Raises:
        FlagError: a field is missing, the per-request lists differ in length, or a
            length is negative (prefix) or below 1 (extend).
    """
    prefix_lens = _int_list(fb, "extend_prefix_lens_cpu")
    extend_lens = _int_list(fb, "extend_seq_lens_cpu")
    if len(prefix_lens) != len(extend_lens):
        raise FlagError(
            f"forward batch: extend_prefix_lens_cpu has {len(prefix_lens)} entries but "
            f"extend_seq_lens_cpu has {len(extend_lens)}; they must match per request"
        )
    rids = _rids(fb, len(extend_lens))
    logprob = bool(getattr(fb, "return_logprob", False))
    capture = _capture_hidden(getattr(fb, "capture_hidden_mode", None))
    requests = []
    for rid, prefix_len, extend_len in zip(rids, prefix_lens, extend_lens, strict=True):
        if prefix_len < 0 or extend_len < 1:
            raise FlagError(
                f"forward batch: request {rid!r} needs prefix_len >= 0 and extend_len >= 1, "
                f"got prefix_len={prefix_len} extend_len={extend_len}"
            )
        requests.append(RequestSpec(rid, prefix_len, extend_len, None, logprob, capture))
    spec = _spec_name(getattr(fb, "spec_algorithm", None))
    return BatchSpec(batch_index, tuple(requests), spec)


def _int_list(fb: object, name: str) -> list[int]:
    value = getattr(fb, name, None)
    if value is None:
        raise FlagError(f"forward batch: {name} is missing; is this an extend (prefill) batch?")
    if not isinstance(value, list | tuple):
        raise FlagError(f"forward batch: {name} must be a list of ints, got {value!r}")
    ints = []
    for i, v in enumerate(value):
        try:
            # NOTE: operator.index accepts ints (numpy's too) but not 3.7 or "3".
            ints.append(operator.index(v))
        except TypeError:
            raise FlagError(f"forward batch: {name}[{i}] must be an int, got {v!r}") from None
    return ints


def _rids(fb: object, count: int) -> list[str]:
    rids = getattr(fb, "rids", None)
    if rids is None:
        return [f"r{i}" for i in range(count)]
    if not isinstance(rids, list | tuple):
        raise FlagError(f"forward batch: rids must be a list of ids, got {rids!r}")
    rids = [str(r) for r in rids]
    if len(rids) != count or len(set(rids)) != count:
        raise FlagError(f"forward batch: rids must be {count} distinct ids, got {rids!r}")
    return rids


def _spec_name(algorithm: object) -> str | None:
    if algorithm is None:
        return None
    if isinstance(algorithm, str):
        name = algorithm.strip()
        return None if name.upper() in ("", "NONE") else name
    is_none = getattr(algorithm, "is_none", None)
    if callable(is_none) and is_none():
        return None
    return str(getattr(algorithm, "name", algorithm))


def _capture_hidden(mode: object) -> bool:
    if mode is None:
        return False
    need_capture = getattr(mode, "need_capture", None)
    if callable(need_capture):
        return bool(need_capture())
    name = mode if isinstance(mode, str) else getattr(mode, "name", None)
    if isinstance(name, str):
        return name.strip().upper() not in ("", "NULL")
    return bool(mode)
