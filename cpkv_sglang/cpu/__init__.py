"""SGLang 0.5.23's CP tail on CPU ranks, for the plugin's tests and ``cpkv bench``; entry
point :func:`cpkv_sglang.cpu.ranks.run_ranks`.

Each rank is a process forked from a server that imported SGLang once. It publishes its own
``ServerArgs`` as a scheduler does, and runs SGLang's own ``is_cp_active``,
``prepare_cp_forward`` and ``EagerRunner._execute_extend_cp`` with SGLang's
``LogitsProcessor`` on a small per-token model. Only SGLang's process groups are replaced,
by groups that move real bytes over a gloo process group (:mod:`cpkv_sglang.cpu.group`);
what else stands in is listed in :mod:`cpkv_sglang.cpu.standins`.
"""
