"""Bridges that put Netra's tactics inside other engines' processes.

`netra.plugins.sglang` is SGLang 0.5.23's ``sglang.srt.plugins`` entry point (pyproject.toml): AROUND
hooks that ask Netra's dispatch and otherwise call SGLang's original. `netra.plugins.evidence` is the
file each hooked process writes and the launcher's audit reads (stdlib only).
"""
