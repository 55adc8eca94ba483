"""The SGLang MoE peer on the CPU, no GPU: its loading and its Python path (the GPU run that checks and times it
beside ours is the ``moe`` spec, `netra.bench.specs.moe`).

``--self-test`` runs everything up to the first CUDA call: the loader, the stubs, the imports of SGLang's modules,
the tuned configs it resolves and the prebuilt JIT modules (resolved by SGLang's own module names and loaded
through tvm_ffi, with the sm_90a target forced as on the H200), then the dry run in a fresh process.
``--dry-run``: every line of SGLang's Python for ``routed`` and ``block`` runs on CPU tensors, each Triton launch
and JIT-module call recorded instead of executed (the kernel sequence per token count)::

    .venv/bin/python -m netra.bench.peers.sglang_moe_dry --self-test [--root .sglang_peer]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from netra.bench.peers import sglang_loader, sglang_moe
from netra.bench.peers.sglang_moe import HIDDEN, INTER, TOPK, E
from netra.settings import REPO_ROOT

TOKENS = (1, 2, 4, 8, 16, 32, 64, 128)


def self_test(root: Path) -> dict[str, Any]:
    """No GPU: install the peer, import SGLang's modules, resolve configs and prebuilt JIT modules."""
    import importlib

    out: dict[str, Any] = {}
    sglang_loader.install(root)
    modules = sorted(sglang_loader.merge(sglang_loader.manifests()).modules)
    for name in modules:
        importlib.import_module(name)
    out["modules"] = len(modules)
    cfg = importlib.import_module("sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config")
    out["configs"] = {}
    for m in TOKENS:
        up, (down, _) = cfg.try_get_optimal_moe_config((E, 2 * INTER, HIDDEN), (E, HIDDEN, INTER), TOPK, "fp8_w8a8",
                                                       m, block_shape=[128, 128], return_down_config=True)
        out["configs"][str(m)] = {"up": up, "down": down, "path": sglang_moe.path_notes(m)}
    from sglang.kernels.jit.utils import override_jit_cuda_arch  # type: ignore[import-not-found]

    with override_jit_cuda_arch(*sglang_loader.JIT_TARGET):  # what the H200 detects
        for jb in sglang_moe.JIT:
            getattr(importlib.import_module(jb.module), jb.getter)(*sglang_loader._dtype_args(jb.args), **jb.kwargs)
    fp8u = importlib.import_module("sglang.srt.layers.quantization.fp8_utils")
    out["shared_linear"] = fp8u.dispatch_w8a8_block_fp8_linear([128, 128]).__name__
    fm = importlib.import_module("sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe")
    out["moe_sum_reduce"] = type(fm.moe_sum_reduce).__name__
    out["notes"] = sorted(set(sglang_loader.NOTES))
    return out


def dry_run(root: Path, tokens: tuple[int, ...] = TOKENS) -> dict[str, Any]:
    """No GPU: every line of SGLang's Python for ``routed`` and ``block`` runs on CPU tensors, with each
    Triton launch and each JIT-module call recorded instead of executed. Returns the kernel sequence
    per token count (the record's account of what ran), after ``self_test`` installed the peer."""
    import importlib

    import torch
    from triton.runtime.jit import KernelInterface

    tvm_ffi = importlib.import_module("tvm_ffi")

    calls: list[str] = []

    def getitem(self: Any, grid: Any) -> Any:
        fn = self
        while hasattr(fn, "fn"):
            fn = fn.fn
        return lambda *a, **k: calls.append(fn.__name__ + (" [pdl]" if k.get("launch_pdl") else ""))

    class DryModule:
        def __init__(self, name: str) -> None:
            self.name = name

        def __getattr__(self, attr: str) -> Any:
            return lambda *a, **k: calls.append(f"jit {self.name}.{attr}")

    KernelInterface.__getitem__ = getitem  # type: ignore[method-assign]
    tvm_ffi.load_module = lambda path: DryModule(Path(path).stem.removeprefix("sgl_kernel_jit_"))  # type: ignore
    from sglang.kernels.jit.utils import override_jit_cuda_arch  # type: ignore[import-not-found]

    f8 = torch.float8_e4m3fn
    z = torch.zeros
    peer = sglang_moe.SglangMoePeer(z(E, 2 * INTER, HIDDEN, dtype=f8), z(E, 8, 16), z(E, HIDDEN, INTER, dtype=f8),
                                    z(E, 16, 4), z(E, HIDDEN, dtype=torch.bfloat16), z(2 * INTER, HIDDEN, dtype=f8),
                                    z(8, 16), z(HIDDEN, INTER, dtype=f8), z(16, 4), z(1, HIDDEN, dtype=torch.bfloat16),
                                    root=root)
    out: dict[str, Any] = {}
    with override_jit_cuda_arch(*sglang_loader.JIT_TARGET):
        for m in tokens:
            x = z(m, HIDDEN, dtype=torch.bfloat16)
            ids = torch.stack([torch.randperm(E)[:TOPK] for _ in range(m)]).to(torch.int32)
            calls.clear()
            y = peer.routed(x, ids, torch.full((m, TOPK), 1.0 / TOPK))
            routed, calls[:] = list(calls), []
            yb = peer.block(x)
            assert y.shape == yb.shape == (m, HIDDEN) and y.dtype == yb.dtype == torch.bfloat16
            out[str(m)] = {"routed": routed, "block": list(calls)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m netra.bench.peers.sglang_moe_dry", description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=REPO_ROOT / ".sglang_peer", help="the staged peer folder")
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    ap.add_argument("--self-test", action="store_true", help="loader, stubs, imports, configs, JIT modules, "
                                                                "then the dry run")
    ap.add_argument("--dry-run", action="store_true", help="SGLang's Python with kernel launches recorded")
    a = ap.parse_args(argv)
    if a.dry_run:
        sglang_loader.install(a.root)
        res = {"dry_run": dry_run(a.root, tuple(int(t) for t in a.tokens.split(","))),
               "notes": sorted(set(sglang_loader.NOTES))}
        print(json.dumps(res, default=str))
        return 0
    if not a.self_test:
        ap.error("--self-test or --dry-run")
    res = self_test(a.root)
    # a fresh process: SGLang caches the JIT modules self_test just loaded for real
    dry = subprocess.run([sys.executable, "-m", "netra.bench.peers.sglang_moe_dry", "--dry-run", "--root",
                          str(a.root)], capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    if dry.returncode != 0:
        print(dry.stderr[-4000:])
        return 1
    dry_doc = json.loads(dry.stdout.strip().splitlines()[-1])
    res["dry_run"] = dry_doc["dry_run"]
    res["notes"] = sorted(set(res["notes"]) | set(dry_doc["notes"]))
    print(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
