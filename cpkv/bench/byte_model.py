"""The model the bench's counting jobs run: the bench's model with one query head and one
indexer head (``one_head``).

What a rank all-gathers, stores and sends is made of token rows (an MLA row: latent KV, index
K and its scale, none with a head dimension), last-token hidden states and page tables; which
pages a rank gathers or writes follows from the plan, not from what the indexer picks. So the
heads change no byte, call or page a count-only figure holds, while they set most of the
compute between the counts: the query and indexer projections, the indexer's dots, the
attention, and the output projection's ``num_heads x kv_lora_rank`` terms.

Count-only jobs run on it: ``kv_share``, the bytes of ``cp_off`` and the write path of
``balance``. The PD figure's model (``pd.pd_model``) has one head of each too, with rows
widened to a real model's (its docstring says what that changes in its times). The other
timed figures keep the model's heads: step time, ``cp_off``'s times, peer-read, rollback.
``tests/test_bench_bytes.py`` runs a trace at every level on both and compares every count.
"""

from __future__ import annotations

from cpkv_core.config import ModelConfig

__all__ = ["one_head"]


def one_head(model: ModelConfig) -> ModelConfig:
    """``model`` with one query head and one indexer head (none where it has no indexer):
    the same layers and token rows."""
    heads = {"num_heads": 1, "index_n_heads": min(1, model.index_n_heads)}
    return model.model_copy(update={"name": f"{model.name}-one-head", **heads})
