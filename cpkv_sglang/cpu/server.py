"""One CPU rank's SGLang process state, as ``run_scheduler_process`` sets it up:
:func:`publish_rank`.

The rank publishes a ``ServerArgs`` with prefill CP on (its ``model_path`` is ``dummy``: the
resolution pipeline's own short cut past checkpoint downloads and the CUDA platform rules),
then hands SGLang the model's ``config.json`` the way SGLang's own tests do (the memoized
``ModelConfig`` on the record), so the DSA rules (``is_dsa_enable_prefill_cp``) read the
architecture. Then its attention-CP group becomes a :class:`~cpkv_sglang.cpu.group.CommGroup`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cpkv_core.dist import Communicator
from cpkv_sglang.cpu.group import CommGroup

__all__ = ["MODEL_CONFIGS", "publish_rank"]

_DSA_FIELDS: dict[str, Any] = {
    "hidden_size": 64,
    "vocab_size": 96,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "kv_lora_rank": 16,
    "q_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 8,
    "index_topk": 16,
    "index_head_dim": 16,
    "index_n_heads": 4,
    "intermediate_size": 64,
    "moe_intermediate_size": 32,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "max_position_embeddings": 65536,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000,
    "torch_dtype": "bfloat16",
}

MODEL_CONFIGS: dict[str, dict[str, Any]] = {
    "interleave": {
        "architectures": ["DeepseekV32ForCausalLM"],
        "model_type": "deepseek_v32",
        **_DSA_FIELDS,
    },
    "zigzag": {
        "architectures": ["GlmMoeDsaForCausalLM"],
        "model_type": "glm_moe_dsa",
        **_DSA_FIELDS,
    },
}
"""The DSA architecture of each strategy: DeepSeek-V3.2 runs interleave, GLM-5 zigzag (SGLang
0.5.23 refuses DeepSeek-V3.2 with zigzag). Small sizes: only the architecture and the DSA
fields are read."""


def publish_rank(comm: Communicator, strategy: str, scratch: Path) -> tuple[Any, CommGroup]:
    """Publishes this rank's ``ServerArgs`` (role ``scheduler``, ``tp = attn_cp =`` the
    group's size) and installs its attention-CP group. The model's ``config.json`` is
    written to ``scratch/model``.

    Returns:
        The published ``ServerArgs`` and the rank's group.
    """
    from sglang.srt import runtime_context as rc
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.server_args import ServerArgs

    cp_size = comm.world_size
    server_args = ServerArgs(
        model_path="dummy",
        device="cpu",
        tp_size=cp_size,
        enable_prefill_cp=True,
        cp_strategy=strategy,
        attn_cp_size=cp_size,
        skip_tokenizer_init=True,
    )
    folder = scratch / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(MODEL_CONFIGS[strategy]))
    server_args._model_config = ModelConfig(model_path=str(folder))
    rc.publish(server_args, role="scheduler", ranks=rc.SpawnRanks(world_rank=comm.rank))
    group = CommGroup(comm)
    rc.get_parallel().override_permanently(attn_cp_group=group)
    return server_args, group
