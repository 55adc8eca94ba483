"""Measurement: kernel timing protocol (`kernels`) and the serving load generator (`serve`, `sweep`, `compare`)."""
