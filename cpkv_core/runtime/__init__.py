"""The run step: KV pools, KV access, the model, the CP engine and the non-CP reference."""
