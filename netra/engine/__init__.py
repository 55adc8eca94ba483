"""The embedded engine: Qwen3.5/3.6 hybrid-MoE model, continuous batching, SGLang's worker HTTP contract."""
