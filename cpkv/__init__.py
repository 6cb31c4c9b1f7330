"""cpkv, the app: the typer CLI (``cpkv.cli:main``), the trace runner, reports."""

__all__: list[str] = []
