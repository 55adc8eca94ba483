"""The FP8-output norms (kernels/sm90/norm, the ``*_fp8_*`` contracts) in front of the FP8 projections they feed,
checked and timed as the engine calls them (the activation quantization folded into its producer).

Pairs (the model's): the input norm (residual add + Gemma RMSNorm, rows of 2048) -> the GDN in-projection qkv|z
(FP8 group 8192 + 4096) and -> the attention q|gate,k,v (8192 + 512 + 512); GDN's gated output norm (32 heads of 128
per token) -> the out-projection 2048 x 4096; and the plain Gemma RMSNorm's FP8 output, which no projection of the
model reads (its final norm feeds the BF16 lm_head), in front of a 4096 x 2048 FP8 projection so that its contracts
are measured the same way. Rows: 1, 8, 32, 64, 128 (decode buckets) and 1024, 8192 (prefill).

Check, through `netra.ops` (dispatch at experiment maturity picks the contracts; the decisions are recorded): the
fused norm's BF16 rows bitwise the plain norm's, its E4M3 rows and scales bitwise the projection's own quantization
kernel (`quantize_rows`) on those rows, the projection's output bitwise the unfused pair's; the E4M3 output poisoned
first; eager == CUDA-graph replay at decode rows. Providers: ``unfused`` (plain norm -> quantization kernel -> GEMM,
what the engine ran before) and ``fused`` (FP8-output norm -> GEMM, the contract's tactic); the floor is the pair's
bytes (weights + the norm's reads and writes).

Smoke (CPU, interpreter): the FP8-output entries called directly at a few rows, the same three bitwise checks
against the plain entry, `fp8.quantize_per_token_group` and the projection's entry.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from functools import partial
from typing import Any

from netra.bench.harness import Case, CaseBuilder, Spec, entry

# (label, producer, FP8 projection parts' N, K)
PAIRS = [("gdn_in", "add", (8192, 4096), 2048), ("attn_in", "add", (8192, 512, 512), 2048),
         ("gdn_out", "gated", (2048,), 4096), ("plain", "plain", (4096,), 2048)]
ROWS = (1, 8, 32, 64, 128, 1024, 8192)
L2_BYTES = 120 << 20
CONTRACTS = ("add_rmsnorm_gemma_fp8_rows", "add_rmsnorm_gemma_fp8_prefill", "gated_rmsnorm_fp8_rows",
             "gated_rmsnorm_fp8_prefill", "rmsnorm_gemma_fp8_rows", "rmsnorm_gemma_fp8_prefill")
PREFIX = {"add": "add_rmsnorm_gemma", "gated": "gated_rmsnorm", "plain": "rmsnorm_gemma"}


def inputs(producer: str, m: int, k: int, seed: int, device: str) -> tuple[Any, ...]:
    """Adversarial rows: one huge row, an outlier group, a zero row (add); a huge head (gated)."""
    import torch

    g = torch.Generator(device=device).manual_seed(1000 + seed)
    if producer == "gated":
        o = torch.randn(m, 32, 128, generator=g, device=device) * 2
        o[0] *= 1e3
        proj = torch.randn(m, 2 * 32 * 128, generator=g, device=device) * 2
        w = torch.randn(128, generator=g, device=device) * 0.1
        return o.bfloat16(), proj.bfloat16(), w.bfloat16()
    x = torch.randn(m, k, generator=g, device=device) * 3
    x[0] *= 1e4
    if m > 2:
        x[1, :128] *= 300.0
        x[2] = 0.0
    r = torch.randn(m, k, generator=g, device=device) * 5
    w = torch.randn(k, generator=g, device=device) * 0.1
    return x.bfloat16(), r.bfloat16(), w.bfloat16()


def weights(ns: tuple[int, ...], k: int, seed: int, device: str) -> list[Any]:
    import torch

    from netra.ops import fp8
    from netra.ops.linear import Weight

    g = torch.Generator(device=device).manual_seed(seed)
    return [Weight(*fp8.block_quantize_weight(torch.randn(n, k, generator=g, device=device) * k ** -0.5)) for n in ns]


class Pair:
    """One norm -> projection pair at ``m`` tokens on the GPU: input and weight copies past the L2, and both ways
    of running it through `netra.ops`."""

    def __init__(self, label: str, producer: str, ns: tuple[int, ...], k: int, m: int) -> None:
        self.label, self.producer, self.ns, self.k, self.m = label, producer, ns, k, m
        wbytes = sum(ns) * k
        self.copies = max(2, min(8, -(-L2_BYTES // wbytes)))
        self.ws = [weights(ns, k, 100 * c, "cuda") for c in range(self.copies)]
        self.ins = [inputs(producer, m, k, c, "cuda") for c in range(self.copies)]
        read = self.ins[0] if producer != "plain" else (self.ins[0][0], self.ins[0][2])  # no residual read
        self.floor_bytes = wbytes + sum(t.numel() * t.element_size() for t in read) * 2

    def norm(self, i: int, quant: str) -> Any:
        from netra.ops import norm

        a, b, w = self.ins[i]
        if self.producer == "gated":
            z = b[:, 32 * 128:].reshape(self.m, 32, 128)  # the engine's strided view of the in-projection
            return norm.gated_rmsnorm_quant(a, z, w, 1e-6, quant).reshape(self.m, 32 * 128)
        if self.producer == "plain":
            return norm.rmsnorm_quant(a, w, 1e-6, quant)
        return norm.add_rmsnorm_quant(a, b, w, 1e-6, quant)[0]

    def project(self, rows: Any, i: int) -> list[Any]:
        from netra.ops.linear import linear, linear_group

        ws = self.ws[i]
        return [linear(rows, ws[0])] if len(ws) == 1 else linear_group(rows, ws)

    def run(self, i: int, fused: bool) -> list[Any]:
        from netra.ops import fp8

        return self.project(self.norm(i, fp8.ACT_GROUP128 if fused else "none"), i)

    def check(self) -> dict[str, Any]:
        import torch

        from netra.bench.timing import capture
        from netra.ops import _common, fp8
        from netra.ops._triton import load_source
        from netra.validate.compare import compare
        from netra.validate.oracle import poison_next

        bits = {"policy": "bitwise"}
        quantize_rows = load_source("kernels/sm90/linear/linear.py").quantize_rows
        _common.reset_decisions()
        poison_next((self.m, self.k), torch.float8_e4m3fn, torch.device("cuda"))
        rows = self.norm(0, fp8.ACT_GROUP128)
        out: dict[str, Any] = {"fused_selected": isinstance(rows, fp8.GroupQuantized)}
        out["decisions"] = _common.decisions()
        if not out["fused_selected"]:
            return {**out, "ok": False}
        got = self.project(rows, 0)
        plain = self.norm(0, "none")
        q, s = quantize_rows(plain.reshape(-1, self.k))
        want = self.project(plain, 0)
        out.update(rows=compare(bits, rows.x, plain), q=compare(bits, rows.q.reshape(-1, self.k), q),
                   scale=compare(bits, rows.scale.reshape(-1, self.k // 128), s),
                   projection=[compare(bits, a, b) for a, b in zip(got, want, strict=True)])
        ok = out["rows"]["ok"] and out["q"]["ok"] and out["scale"]["ok"] and all(p["ok"] for p in out["projection"])
        if self.m <= 128:
            g, rep = capture(lambda: self.run(0, True))
            g.replay()
            torch.cuda.synchronize()
            out["eager_equals_replay"] = all(torch.equal(a, b) for a, b in zip(got, rep, strict=True))
            ok = ok and out["eager_equals_replay"]
            del g
        return {**out, "ok": ok}


def fused_contract(producer: str, m: int) -> str:
    """The FP8-output contract dispatch picks for ``m`` tokens (the gated norm's rows are tokens x 32 heads)."""
    rows, limit = (m * 32, 4096) if producer == "gated" else (m, 128)
    return f"{PREFIX[producer]}_fp8_{'rows' if rows <= limit else 'prefill'}"


def gpu_case(label: str, producer: str, ns: tuple[int, ...], k: int, m: int) -> Case:
    pair = Pair(label, producer, ns, k, m)
    return Case(key=f"{label} m={m}", op="norm_" + label, shape={"n": list(ns), "k": k, "m": m}, dtype="fp8",
                providers={"unfused": lambda i: pair.run(i, False), "fused": lambda i: pair.run(i, True)},
                check=pair.check, contract=fused_contract(producer, m), ours="fused", n_inputs=pair.copies,
                floor_bytes=pair.floor_bytes, hold=pair)


def cases(opts: argparse.Namespace) -> Iterator[CaseBuilder]:
    rows = [int(v) for v in str(getattr(opts, "norm_rows", "") or ",".join(map(str, ROWS))).split(",")]
    for label, producer, ns, k in PAIRS:
        for m in rows:
            yield partial(gpu_case, label, producer, ns, k, m)


def smoke_check(producer: str, m: int) -> dict[str, Any]:
    """The three bitwise checks with the entries called directly (CPU, interpreter)."""
    import torch

    from netra.ops import fp8
    from netra.validate.compare import compare

    bits = {"policy": "bitwise"}
    name = fused_contract(producer, m)
    fused, _ = entry(name)
    plain, _ = entry(name.replace("_fp8", ""))
    k = 128 if producer == "gated" else 2048
    if producer == "plain":
        x, _, w = inputs("plain", m, k, 0, "cpu")
        rows, q, s = fused(x=x, weight=w, eps=1e-6)
        want = plain(x=x, weight=w, eps=1e-6)
        res: dict[str, Any] = {}
    elif producer == "gated":
        x, proj, w = inputs("gated", m, 4096, 0, "cpu")
        z = proj[:, 32 * 128:].reshape(m, 32, 128)
        rows, q, s = fused(x=x, z=z, weight=w, eps=1e-6)
        want = plain(x=x, z=z, weight=w, eps=1e-6)
        res = {}  # the plain norm writes no residual
    else:
        x, r, w = inputs("add", m, k, 0, "cpu")
        rows, q, s, new_res = fused(x=x, residual=r, weight=w, eps=1e-6)
        want, res_want = plain(x=x, residual=r, weight=w, eps=1e-6)
        res = {"residual": compare(bits, new_res, res_want)}
    q_ref, s_ref = fp8.quantize_per_token_group(rows)
    out = {"rows": compare(bits, rows, want), "q": compare(bits, q, q_ref), "scale": compare(bits, s, s_ref), **res}
    if producer == "add":  # the projection behind it reads the E4M3 form bitwise as its own quantization
        lin, _ = entry("linear_fp8_block_decode")
        wt = weights((64,), k, 7, "cpu")[0]
        out["projection"] = compare(bits, lin(x=rows, weight=wt, out_dtype=torch.bfloat16, xq=q, xs=s),
                                    lin(x=rows, weight=wt, out_dtype=torch.bfloat16))
    return {**out, "ok": all(v["ok"] for v in out.values())}


def smoke() -> Iterator[CaseBuilder]:
    for producer, m in (("add", 5), ("gated", 3), ("plain", 4)):
        yield partial(Case, key=f"{producer} m={m}", op="norm_" + producer, shape={"m": m}, dtype="fp8",
                      check=partial(smoke_check, producer, m), contract=fused_contract(producer, m))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--norm-rows", default="", help="norm_fp8: comma-separated token counts (default: all buckets)")


def setup(opts: argparse.Namespace) -> dict[str, Any]:
    from netra import dispatch

    if not getattr(opts, "smoke", False):
        dispatch.reset(dispatch.Dispatcher(min_maturity="experiment"))
    return {"min_maturity": "experiment"}


SPEC = Spec(name="norm_fp8", family="norm", doc="FP8-output norms in front of their FP8 projections",
            cases=cases, smoke=smoke, contracts=CONTRACTS, setup=setup, add_arguments=add_arguments)
