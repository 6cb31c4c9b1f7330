"""PNG figures drawn from the commands' JSON documents; the entry point is :func:`write_outputs`.

Import it only when ``--out`` is given: it loads matplotlib (Agg canvas, no display).
"""

from cpkv.plots.base import Plot, PlotFn, Series, Skip, Written, write_outputs

__all__ = ["Plot", "PlotFn", "Series", "Skip", "Written", "write_outputs"]
