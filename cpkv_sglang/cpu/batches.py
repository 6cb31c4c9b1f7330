"""SGLang ``ForwardBatch`` objects for the CPU harness, as the scheduler hands them to the model
runner for a prefill (EXTEND) batch: :func:`forward_batch`, from a :class:`BatchShape`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["BatchShape", "forward_batch", "token_ids"]


@dataclass(frozen=True, slots=True)
class BatchShape:
    """One prefill batch: per request, its cached prefix and its current tokens."""

    extend_lens: tuple[int, ...]
    prefix_lens: tuple[int, ...]
    return_logprob: bool = False
    """Every request returns logprobs (of its last token only: no input logprobs)."""
    capture: str = "NULL"
    """``CaptureHiddenMode`` name: NULL, LAST or FULL."""
    spec: str = "NONE"
    """``SpeculativeAlgorithm`` name (``EAGLE``: a target model's extend)."""
    bcg: bool = False
    """Run the batch's forward inside SGLang's breakable-CUDA-graph scope."""

    @property
    def num_tokens(self) -> int:
        """Current tokens of the batch."""
        return sum(self.extend_lens)


def token_ids(shape: BatchShape, vocab: int, seed: int) -> torch.Tensor:
    """``[num_tokens]`` token ids drawn from ``seed`` (the same on every rank)."""
    draw = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (shape.num_tokens,), generator=draw)


def forward_batch(shape: BatchShape, input_ids: torch.Tensor) -> Any:
    """SGLang's ``ForwardBatch`` of ``shape`` (EXTEND mode, CPU tensors)."""
    from sglang.srt.model_executor.forward_batch_info import (
        CaptureHiddenMode,
        ForwardBatch,
        ForwardMode,
    )
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    bs = len(shape.extend_lens)
    extend = torch.tensor(shape.extend_lens, dtype=torch.int64)
    prefix = torch.tensor(shape.prefix_lens, dtype=torch.int64)
    seq_lens = extend + prefix
    num_tokens = shape.num_tokens
    fb = ForwardBatch(
        forward_mode=ForwardMode.EXTEND,
        batch_size=bs,
        input_ids=input_ids,
        req_pool_indices=torch.arange(bs),
        seq_lens=seq_lens,
        out_cache_loc=torch.arange(num_tokens),
        seq_lens_sum=int(seq_lens.sum()),
    )
    fb.seq_lens_cpu = seq_lens.clone()
    fb.positions = torch.cat(
        [torch.arange(p, p + e) for p, e in zip(shape.prefix_lens, shape.extend_lens, strict=True)]
    )
    fb.extend_seq_lens = extend
    fb.extend_seq_lens_cpu = list(shape.extend_lens)
    fb.extend_prefix_lens = prefix
    fb.extend_prefix_lens_cpu = list(shape.prefix_lens)
    fb.extend_start_loc = torch.cumsum(extend, 0) - extend
    fb.extend_num_tokens = num_tokens
    fb.return_logprob = shape.return_logprob
    fb.top_logprobs_nums = [0] * bs
    fb.token_ids_logprobs = [None] * bs
    # NOTE: a start at the request's end asks for no input logprob; the last token's
    # logprob comes with sampling.
    fb.extend_logprob_start_lens_cpu = list(shape.extend_lens)
    fb.capture_hidden_mode = CaptureHiddenMode[shape.capture]
    fb.spec_algorithm = SpeculativeAlgorithm[shape.spec]
    return fb
