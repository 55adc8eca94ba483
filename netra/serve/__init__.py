"""The response layer: one OpenAI-compatible HTTP process per worker (see docs/serve.md)."""
