"""The model the CPU harness runs through SGLang's CP path: :class:`TinyCausalLM`.

It has the attributes ``EagerRunner._execute_extend_cp`` reads off a model
(``get_input_embeddings``, ``model``, ``pp_group``, ``capture_aux_hidden_states``,
``logits_processor``, ``lm_head``) and a ``forward`` for batches SGLang runs unsplit. Its
body is per token (a token's state depends on its id and position only), so a CP rank
computes its shard's rows exactly as one rank would compute them; the logits processor is
SGLang's own ``LogitsProcessor``. The weights are drawn from a fixed seed: every rank and
every run holds the same.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from cpkv_sglang.cpu.group import LastPipelineRank

__all__ = ["TinyCausalLM"]


class _Body(nn.Module):
    """``h = embed(id) * (1 + position / 1024)``, elementwise, in the embedding's dtype.

    With ``inner_gather``, a CP forward's body also all-gathers its states through
    ``cp_gather_after_forward``, as DeepSeek's DSA top-k share does inside the model, and adds
    a hundredth of their mean to every row: a gather phase 1 must leave whole.
    """

    def __init__(self, aux: bool, inner_gather: bool) -> None:
        super().__init__()
        self.aux = aux
        self.inner_gather = inner_gather

    def forward(
        self,
        input_ids: Tensor | None,
        positions: Tensor,
        forward_batch: Any,
        input_embeds: Tensor | None = None,
        **kwargs: Any,
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        assert input_embeds is not None, "the CP path hands the body its embeddings"
        scale = positions.to(torch.float32).div(1024.0).add(1.0).to(input_embeds.dtype)
        hidden = input_embeds * scale[:, None]
        if self.inner_gather and forward_batch.attn_cp_metadata is not None:
            from sglang.srt.layers.cp.utils import cp_gather_after_forward

            full = cp_gather_after_forward(hidden, forward_batch)
            hidden = hidden + full.float().mean(0, keepdim=True).div(100).to(hidden.dtype)
        if self.aux:
            return hidden, [hidden * 2]
        return hidden


class TinyCausalLM(nn.Module):
    """A per-token model with SGLang's logits processor (see the module docstring)."""

    def __init__(
        self,
        hf_config: Any,
        hidden: int,
        vocab: int,
        dtype: torch.dtype = torch.bfloat16,
        aux: bool = False,
        last_pipeline_rank: bool = True,
        inner_gather: bool = False,
    ) -> None:
        from sglang.srt.layers.logits_processor import LogitsProcessor

        super().__init__()
        draw = torch.Generator().manual_seed(29)
        self.embed = nn.Embedding(vocab, hidden)
        self.embed.weight.data = torch.randn(vocab, hidden, generator=draw).to(dtype)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        self.lm_head.weight.data = torch.randn(vocab, hidden, generator=draw).to(dtype)
        self.model = _Body(aux, inner_gather)
        self.capture_aux_hidden_states = aux
        self.pp_group = LastPipelineRank(last_pipeline_rank)
        # NOTE: the LM head holds the whole vocabulary on every rank, so no TP logits gather
        # (a GPU server's vocab-parallel head gathers [bs, vocab/tp] after the pruning).
        self.logits_processor = LogitsProcessor(hf_config, skip_all_gather=True)

    def get_input_embeddings(self) -> nn.Embedding:
        """The token embedding, as SGLang's models expose it."""
        return self.embed

    def forward(
        self, input_ids: Tensor, positions: Tensor, forward_batch: Any, **kwargs: Any
    ) -> Any:
        """An unsplit batch: every token on this rank, then the logits processor."""
        out = self.model(input_ids, positions, forward_batch, input_embeds=self.embed(input_ids))
        hidden, aux = out if isinstance(out, tuple) else (out, None)
        return self.logits_processor(input_ids, hidden, self.lm_head, forward_batch, aux)
