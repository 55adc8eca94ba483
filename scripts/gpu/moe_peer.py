"""The SGLang MoE peer on the H200: correctness against plain-PyTorch references, then timing.

Run from the repo root with the staged peer folder carried (``make sglang-peer`` makes
``.sglang_peer/``: SGLang's files, its JIT modules prebuilt for sm_90a, the cp312 wheels):

    timeout 240 python scripts/gpu/moe_peer.py --out $OUT/moe_peer       # on the H200
    .venv/bin/python scripts/gpu/moe_peer.py --self-test                 # here, no GPU

Checks (eager, fresh random inputs, at every token count): the routed experts
(``SglangMoePeer.routed``: SGLang's ``fused_experts_impl``) against ``netra.ops.moe_fp8.moe_routed_ref``;
the block (router + routed + shared + gated combine) against ``block_ref`` below; the router's ids
against the exact top-8; CUDA-graph replay (outputs poisoned with NaN first) equal to eager, bitwise.
Timing: ``netra/bench/timing.py`` (rotated input sets, graph replay, interleaved providers, the
copy-rate floor) for the routed part and the whole block at 1..128 tokens. Every step records its
failure and goes on. Writes ``<out>/moe_peer.json`` (RESULTS.md) and prints a table last.

``--self-test`` runs everything up to the first CUDA call: the loader, the stubs, the imports of
SGLang's modules, the tuned configs it resolves, and the prebuilt JIT modules (resolved by SGLang's
own module names and loaded through tvm_ffi, with the sm_90a target forced as on the H200).
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from netra.bench.peers import sglang_loader, sglang_moe  # noqa: E402
from netra.bench.peers.sglang_moe import HIDDEN, INTER, TOPK, E  # noqa: E402

TOKENS = (1, 2, 4, 8, 16, 32, 64, 128)
TOL_REL_L2 = 1e-2  # declared before measuring: both sides quantize activations the same way
N_SETS = 16  # rotated input sets; each has its own router / shared-expert / gate weights
FP8_MAX = 448.0
EXPERT_BYTES = 2 * INTER * HIDDEN + HIDDEN * INTER + 4 * (8 * 16 + 16 * 4)  # w13 + w2 + scales


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


# ---------------------------------------------------------------------------------------------
# weights, inputs and the plain-PyTorch references
# ---------------------------------------------------------------------------------------------

def make_weights(seed: int = 0) -> dict[str, Any]:
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)

    def fp8(*shape: int) -> Any:
        return torch.randn(*shape, device="cuda", generator=g).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)

    def scales(*shape: int, base: float) -> Any:
        return base * (0.5 + torch.rand(*shape, device="cuda", generator=g))

    w: dict[str, Any] = {"w13": fp8(E, 2 * INTER, HIDDEN), "s13": scales(E, 8, 16, base=0.02),
                         "w2": fp8(E, HIDDEN, INTER), "s2": scales(E, 16, 4, base=0.04), "sets": []}
    for _ in range(N_SETS):  # per rotation: a layer's own router, shared expert and gate
        w["sets"].append({"router_w": (0.05 * torch.randn(E, HIDDEN, device="cuda", generator=g)).bfloat16(),
                          "sh_w13": fp8(2 * INTER, HIDDEN), "sh_s13": scales(8, 16, base=0.02),
                          "sh_w2": fp8(HIDDEN, INTER), "sh_s2": scales(16, 4, base=0.04),
                          "gate_w": (0.05 * torch.randn(1, HIDDEN, device="cuda", generator=g)).bfloat16()})
    return w


def make_routing(m: int, seed: int) -> tuple[Any, Any, Any]:
    """x [m, 2048] bf16, distinct top-8 ids (int32) and renormalised softmax weights (fp32)."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, HIDDEN, device="cuda", generator=g).bfloat16()
    ids = torch.stack([torch.randperm(E, device="cuda", generator=g)[:TOPK] for _ in range(m)]).to(torch.int32)
    wts = torch.softmax(torch.randn(m, TOPK, device="cuda", generator=g), dim=-1)
    return x, ids, wts


def _dequant_blocks(q: Any, s: Any) -> Any:
    return q.float() * s.repeat_interleave(128, -2).repeat_interleave(128, -1)


def _fp8_groups(v: Any) -> Any:
    """Per-row 128-group e4m3 quantize-dequantize (what every FP8 GEMM input goes through)."""
    import torch

    f = v.float().reshape(v.shape[0], -1, 128)
    scale = f.abs().amax(-1, keepdim=True).clamp(min=1e-10) / FP8_MAX
    return ((f / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float() * scale).reshape(v.shape)


def _mlp_ref(x: Any, w13: Any, s13: Any, w2: Any, s2: Any) -> Any:
    import torch
    import torch.nn.functional as F

    gu = (_fp8_groups(x) @ _dequant_blocks(w13, s13).t()).bfloat16().float()
    h = (F.silu(gu[:, :INTER]) * gu[:, INTER:]).bfloat16()
    return (_fp8_groups(h) @ _dequant_blocks(w2, s2).t()).to(torch.bfloat16)


def router_ref(x: Any, router_w: Any) -> tuple[Any, Any]:
    """Exact softmax top-8 of the BF16 logits, renormalised: (fp32 weights, int64 ids)."""
    import torch

    logits = (x.float() @ router_w.float().t()).bfloat16().float()
    probs = torch.softmax(logits, dim=-1)
    top, ids = torch.topk(probs, TOPK, dim=-1)
    return top / top.sum(-1, keepdim=True), ids


def block_ref(x: Any, w: dict[str, Any], s: dict[str, Any], wts: Any, ids: Any) -> Any:
    """Plain PyTorch: routed experts at the given top-8 (weighted sum) + sigmoid(gate . x) * shared MLP.
    The block check passes the peer's own routing (checked on its own against ``router_ref``), so a
    near-tie that one BF16 rounding flips cannot fail the numerics of the rest."""
    import torch

    ids = ids.long()
    out = torch.zeros(x.shape[0], HIDDEN, device=x.device, dtype=torch.float32)
    for e in ids.unique().tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        y = _mlp_ref(x[tok], w["w13"][e], w["s13"][e], w["w2"][e], w["s2"][e]).float()
        out.index_add_(0, tok, y * wts[tok, slot].unsqueeze(-1))
    shared = _mlp_ref(x, s["sh_w13"], s["sh_s13"], s["sh_w2"], s["sh_s2"]).float()
    gate = torch.sigmoid(x.float() @ s["gate_w"].float().t())
    return (out + gate * shared).to(torch.bfloat16)


def rel_l2(a: Any, b: Any) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


# ---------------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------------

class Run:
    def __init__(self, out: Path, tokens: list[int]) -> None:
        self.out, self.tokens, self.t0 = out, tokens, time.monotonic()
        self.doc: dict[str, Any] = {"kind": "kernel", "family": "moe", "target": "sm90", "status": "measured",
                                    "rows": [], "checks": {}, "errors": [], "verdict": "info"}

    def step(self, name: str, fn: Any) -> Any:
        try:
            return fn()
        except Exception as exc:  # one failing step must not waste the device call
            self.doc["errors"].append({"step": name, "error": f"{type(exc).__name__}: {exc}",
                                       "trace": traceback.format_exc()[-2000:]})
            print(f"[moe_peer] {name}: FAILED {type(exc).__name__}: {exc}", flush=True)
            return None

    def save(self) -> None:
        self.doc["elapsed_s"] = round(time.monotonic() - self.t0, 1)
        self.doc["peer_notes"] = sorted(set(sglang_loader.NOTES))
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "moe_peer.json").write_text(json.dumps(self.doc, indent=1, default=str) + "\n")


def make_peers(w: dict[str, Any], root: Path) -> list[Any]:
    import torch

    alt = torch.cuda.Stream()
    peers = []
    for s in w["sets"]:
        p = sglang_moe.SglangMoePeer(w["w13"], w["s13"], w["w2"], w["s2"], s["router_w"], s["sh_w13"], s["sh_s13"],
                                     s["sh_w2"], s["sh_s2"], s["gate_w"], root=root)
        p.alt = alt  # one alt stream, as SGLang's model holds one
        peers.append(p)
    return peers


def check(run: Run, peers: list[Any], w: dict[str, Any], m: int) -> None:
    import torch

    from netra.bench.timing import capture
    from netra.ops.moe_fp8 import moe_routed_ref

    x, ids, wts = make_routing(m, seed=7 + m)
    p, s = peers[0], w["sets"][0]
    c: dict[str, Any] = {}
    got = p.routed(x, ids, wts)
    ref = moe_routed_ref(x, ids, wts, w["w13"], w["s13"], w["w2"], w["s2"])
    c["routed_rel_l2"] = rel_l2(got, ref)
    c["routed_finite"] = bool(torch.isfinite(got).all())
    rw, rids = p.router(x)
    ew, eids = router_ref(x, s["router_w"])
    same = (rids.long().sort(-1).values == eids.sort(-1).values).all(-1)
    c["router_rows_equal"] = float(same.float().mean())  # < 1 only on BF16 near-ties
    c["router_w_max_abs"] = float((rw.sort(-1).values - ew.sort(-1).values)[same].abs().max()) if same.any() else None
    blk = p.block(x)
    c["block_rel_l2"] = rel_l2(blk, block_ref(x, w, s, rw, rids))
    c["pass"] = bool(c["routed_rel_l2"] <= TOL_REL_L2 and c["block_rel_l2"] <= TOL_REL_L2 and c["routed_finite"])
    # graph replay == eager, outputs poisoned first
    for name, fn in (("routed", lambda: p.routed(x, ids, wts)), ("block", lambda: p.block(x))):
        eager = fn()
        g, y = capture(fn)
        y.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        c[f"{name}_replay_equals_eager"] = bool(torch.equal(y, eager))
    run.doc["checks"][str(m)] = c
    print(f"[moe_peer] check m={m}: {c}", flush=True)


def bench(run: Run, peers: list[Any], w: dict[str, Any], bw: float, deadline_s: float) -> None:
    from netra.bench.timing import Provider, interleave, row

    for m in run.tokens:
        sets = [make_routing(m, seed=1000 * m + i) for i in range(N_SETS)]
        distinct = sum(len(set(ids.flatten().tolist())) for _, ids, _ in sets) / N_SETS
        act = m * HIDDEN * 2 * 2  # x in, y out (bf16)
        routed_bytes = distinct * EXPERT_BYTES + act
        block_bytes = routed_bytes + E * HIDDEN * 2 + EXPERT_BYTES + HIDDEN * 2  # + router, shared, gate
        def routed(i: int, s: list[Any] = sets) -> Any:
            return peers[i].routed(*s[i])

        def block(i: int, s: list[Any] = sets) -> Any:
            return peers[i].block(s[i][0])

        provs = [Provider("sglang-routed", routed, N_SETS, hold=sets), Provider("sglang-block", block, N_SETS, hold=sets)]
        stats = interleave(provs, samples=30, deadline_s=deadline_s)
        for prov, byts in (("sglang-routed", routed_bytes), ("sglang-block", block_bytes)):
            run.doc["rows"].append(row("moe_block" if prov.endswith("block") else "moe_routed", [m, HIDDEN],
                                       "bf16 x, e4m3 block-128 weights", prov, stats[prov], byts, bw,
                                       tokens=m, distinct_experts=distinct, path=sglang_moe.path_notes(m)))
        print(f"[moe_peer] m={m}: routed {stats['sglang-routed']['median_us']} us, "
              f"block {stats['sglang-block']['median_us']} us", flush=True)
        run.save()


def table(doc: dict[str, Any]) -> str:
    lines = ["| tokens | routed us | block us | routed floor frac | block floor frac | checks |", "|---|---|---|---|---|---|"]
    by: dict[int, dict[str, Any]] = {}
    for r in doc["rows"]:
        by.setdefault(r["tokens"], {})[r["provider"]] = r
    for m in sorted(by):
        rr, bb = by[m].get("sglang-routed", {}), by[m].get("sglang-block", {})
        c = doc["checks"].get(str(m), {})
        ok = "pass" if c.get("pass") and c.get("routed_replay_equals_eager") and c.get("block_replay_equals_eager") \
            else ("FAIL" if c else "-")
        lines.append(f"| {m} | {rr.get('median_us', '-')} | {bb.get('median_us', '-')} | "
                     f"{rr.get('floor_fraction', '-')} | {bb.get('floor_fraction', '-')} | {ok} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("moe_peer_out"))
    ap.add_argument("--root", type=Path, default=ROOT / ".sglang_peer", help="the staged peer folder")
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    ap.add_argument("--git-sha", default=None)
    ap.add_argument("--deadline-s", type=float, default=4.0, help="sampling wall time per token count")
    ap.add_argument("--self-test", action="store_true", help="CPU: loader, stubs, imports, configs, JIT modules, "
                                                                "then the dry run")
    ap.add_argument("--dry-run", action="store_true", help="CPU: SGLang's Python with kernel launches recorded")
    a = ap.parse_args(argv)
    if a.dry_run:
        sglang_loader.install(a.root)
        res = {"dry_run": dry_run(a.root, tuple(int(t) for t in a.tokens.split(","))),
               "notes": sorted(set(sglang_loader.NOTES))}
        print(json.dumps(res, default=str))
        return 0
    if a.self_test:
        res = self_test(a.root)
        # a fresh process: SGLang caches the JIT modules self_test just loaded for real
        dry = subprocess.run([sys.executable, __file__, "--dry-run", "--root", str(a.root)], capture_output=True,
                             text=True, timeout=600)
        if dry.returncode != 0:
            print(dry.stderr[-4000:])
            return 1
        dry_doc = json.loads(dry.stdout.strip().splitlines()[-1])
        res["dry_run"] = dry_doc["dry_run"]
        res["notes"] = sorted(set(res["notes"]) | set(dry_doc["notes"]))
        print(json.dumps(res, indent=1, default=str))
        return 0
    import torch

    from netra.bench.timing import copy_bandwidth

    run = Run(a.out, [int(t) for t in a.tokens.split(",")])
    sha = a.git_sha or run.step("git", lambda: subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT,
                                                               capture_output=True, text=True).stdout.strip())
    run.doc.update(device=torch.cuda.get_device_name(), git_sha=sha or "unknown",
                   date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                   command="timeout 240 python scripts/gpu/moe_peer.py --out <dir> (carry .sglang_peer; "
                           "make sglang-peer)", tolerance_rel_l2=TOL_REL_L2, run_notes=list(sglang_moe.RUN_NOTES),
                   torch=torch.__version__, peer="SGLang 0.5.23 (netra/bench/peers/sglang_moe.py)")
    w = run.step("weights", make_weights)
    peers = run.step("peer", lambda: make_peers(w, a.root)) if w is not None else None
    if peers is not None:
        run.doc["configs"] = run.step("configs", lambda: {m: peers[0].configs(m) for m in run.tokens})
        for m in run.tokens:
            run.step(f"check m={m}", lambda m=m: check(run, peers, w, m))
        run.save()
        bw = run.step("copy bandwidth", copy_bandwidth)
        run.doc["copy_bw_Bps"] = bw
        if bw:
            run.step("bench", lambda: bench(run, peers, w, bw, a.deadline_s))
    run.save()
    print(table(run.doc))
    print(f"[moe_peer] {len(run.doc['errors'])} failed steps; record {a.out / 'moe_peer.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
