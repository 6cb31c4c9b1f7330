"""One module per CLI command, each with ``register(app)``; commands never import each other."""
