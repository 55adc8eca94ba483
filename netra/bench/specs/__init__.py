"""The kernel families' GPU runs as specs over `netra.bench.harness` (one module a spec, ``SPEC = Spec(...)``)."""
