"""SGLang 0.5.23 as cpkv reads it: launch commands, resolution rules, forward batches.

The entry point is :func:`flags.sglang.args.read_sglang`; ``flags`` re-exports it.
"""
