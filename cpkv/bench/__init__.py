"""The figures of ``cpkv bench``, one module per figure; ``suite.run_bench`` runs them all."""
