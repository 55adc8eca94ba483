"""The dense projections (kernels/sm90/linear, the ``linear_*`` contracts) at the model's shapes, beside their peers
(issue 19, item 4).

Shapes: GDN out / attention o 2048 x 4096 (FP8), attention q|gate,k,v 9216 x 2048 (FP8 group 8192 + 512 + 512), GDN
qkv|z 12288 x 2048 (FP8 group 8192 + 4096), GDN b|a 64 x 2048 (BF16 group 32 + 32), lm_head 248320 x 2048 (BF16,
FP32 logits). Rows: 1, 8, 64, 128 (one per decode m-bucket) and 1024, 8192 (prefill; not lm_head), or
``--linear-rows``.

Check, through the op as the engine calls it (dispatch at maturity ``experiment`` must pick the m-bucket's
contract). The inputs are fresh random rows with an outlier group, and the output is poisoned first. Each output
part is judged by `compare` under the contract's numerics against `linear_ref` / `linear_group_ref`, and eager must
equal CUDA-graph replay bitwise (the one eager-only contract, b|a at prefill rows, is checked and timed eagerly).
FP8 shapes add adversarial rows (1e30, 0, 1e-30, one-hot), judged row by row (at prefill: rows 0..3 one by one, the
rest as one block), and the tactic's output in FP32 (the accumulation alone), reported beside the check. Providers:
``netra``; ``sglang`` (SGLang 0.5.23's block-FP8 linear, its quantization + ``w8a8_block_fp8_matmul``:
netra.bench.peers.sglang_gemm); ``cublas_bf16`` (torch.matmul on the dequantized BF16 weight: twice the weight
bytes); ``cublas_f32out`` for lm_head (cuBLAS with the FP32 logits).
A second case per FP8 shape and row count, ``x=e4m3``, times the call on activations a fused norm already
quantized (`fp8.GroupQuantized`: no quantization kernel), beside SGLang's matmul on the same E4M3 rows; its output
must equal the BF16-input call's bitwise. The weights rotate over copies past the L2, so every call reads them from
HBM. The floor is the weight bytes plus x and the output.

``--linear-explore`` adds one exploration case per FP8 shape and row count (no contract: they promote nothing).
These are launch candidates (meta overrides of the bucket's contract launch: tiles, stages, SWAP, MFAST, split
target, PDL, PREFETCH), each checked like the contract and dropped from the timing if it fails, timed beside SGLang
and the quantization pre-kernel alone. This is the tuning sweep folded into the spec: it shares the shapes, inputs,
peers and checks, and stays out of the default run. ``targets``: issue 19's "at least as fast as the best measured
peer at batch 1 and at batch 128".

Smoke (CPU, interpreter): the same check (minus dispatch, poisoning and graphs) through each contract's entry at
small N and K, at one row count per m-bucket.
"""

from __future__ import annotations

import argparse
import copy
import os
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from netra.bench.harness import Case, CaseBuilder, Spec

# (label, parts' N, K, fp8, group)
SHAPES = [("o_proj", (2048,), 4096, True, False), ("attn_qgkv", (8192, 512, 512), 2048, True, True),
          ("gdn_qkvz", (8192, 4096), 2048, True, True), ("gdn_ba", (32, 32), 2048, False, True),
          ("lm_head", (248320,), 2048, False, False)]
ROWS = (1, 8, 64, 128, 1024, 8192)
SMOKE_SHAPES = [("o_proj", (256,), 512, True, False), ("qgkv", (256, 128, 128), 512, True, True),
                ("ba", (32, 32), 256, False, True), ("lm_head", (384,), 256, False, False)]
SMOKE_ROWS = (5, 20, 65, 130)
L2_BYTES = 120 << 20  # rotate weight copies past this (the H200's L2 is 50 MB)
CONTRACTS = ("linear_fp8_block_decode", "linear_fp8_block_decode_m64", "linear_fp8_block_decode_m128",
             "linear_fp8_block_prefill", "linear_group_fp8_decode", "linear_group_fp8_decode_m64",
             "linear_group_fp8_decode_m128", "linear_group_fp8_prefill", "linear_group_bf16_decode",
             "linear_group_bf16_prefill", "linear_bf16_decode", "linear_bf16_cublas_decode")
_PDL = [{"PDL": 0}, {"PDL": 1, "PREFETCH": 0}, {"PDL": 0, "PREFETCH": 1}, {"PDL": 1, "PREFETCH": 1}]
CANDIDATES: dict[int, list[dict[str, Any]]] = {  # m -> meta overrides of the bucket's launch ("block": threads)
    1: [{"SWAP": 0, "BLOCK_N": 128}, {"BLOCK_N": 128}, {"num_stages": 6}, {"TARGET_CTAS": 264}, *_PDL],
    8: _PDL,
    64: [{"SWAP": 0, "BLOCK_N": 128, "num_stages": 3, "TARGET_CTAS": 96}, {"SWAP": 0, "BLOCK_N": 128, "num_stages": 3},
         {"SWAP": 0, "BLOCK_N": 64, "num_stages": 4}, {"SWAP": 0}, {"num_stages": 3}, {"num_stages": 4},
         {"SWAP": 1, "BLOCK_N": 128, "num_stages": 3, "TARGET_CTAS": 96}, *_PDL],
    128: [{"MFAST": 1}, {"SWAP": 0, "BLOCK_M": 64, "BLOCK_N": 128, "num_stages": 3, "MFAST": 1},
          {"SWAP": 0, "BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 4, "MFAST": 1},
          {"SWAP": 1, "BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 4, "MFAST": 1},
          {"SWAP": 0, "BLOCK_M": 128, "BLOCK_N": 64, "num_stages": 3},
          {"SWAP": 0, "BLOCK_N": 128, "BLOCK_M": 128, "block": 256}, {"BLOCK_M": 64}, *_PDL],
    1024: [{"num_stages": 4}, {"num_stages": 2}, {"block": 128}, {"BLOCK_M": 64, "block": 128}, {"BLOCK_N": 64}],
    8192: [{"num_stages": 4}, {"num_stages": 2}, {"block": 128}, {"BLOCK_M": 64, "block": 128}, {"BLOCK_N": 64}],
}


def peer_root() -> Path:
    from netra.bench.peers.sglang_loader import DEFAULT_ROOT

    return Path(os.environ.get("NETRA_SGLANG_PEER", str(DEFAULT_ROOT)))


def as_list(v: Any) -> list[Any]:
    return list(v) if isinstance(v, (list, tuple)) else [v]


def x_of(m: int, k: int, seed: int, device: str) -> Any:
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(m, k, generator=g, device=device)
    x[:, 128:256] *= 50.0  # an outlier group
    return x.to(torch.bfloat16)


def adversarial(m: int, k: int, device: str) -> Any:
    import torch

    x = x_of(m, k, 7, device).float()
    x[0] *= 1e30
    if m > 1:
        x[1] = 0.0
    if m > 2:
        x[2] *= 1e-30
    if m > 3:
        x[3] = 0.0
        x[3, 5] = 3.0
        x[3, 700 % k] = -1e4
    return x.to(torch.bfloat16)


def op_of(fp: bool, group: bool) -> tuple[str, str]:
    """The dispatch op and quant of a projection (as `netra.ops.linear` routes it)."""
    return ("linear_group" if group else ("linear_fp8_block" if fp else "linear_bf16"),
            "fp8_e4m3_block128" if fp else "none")


def launch_of(base: dict[str, Any], ov: dict[str, Any]) -> dict[str, Any]:
    ln = copy.deepcopy(base)
    ln["meta"].update({a: b for a, b in ov.items() if a != "block"})
    if "block" in ov:
        ln["block"] = ov["block"]
    return ln


class Proj:
    """One projection shape on ``device``: weight copies (rotated in timing), the op as the engine calls it, the
    reference, and a tactic's entry called directly."""

    def __init__(self, label: str, ns: Sequence[int], k: int, fp: bool, group: bool, device: str,
                 copies: int | None = None) -> None:
        import torch

        from netra.ops import fp8
        from netra.ops.linear import Weight

        self.label, self.ns, self.k, self.fp, self.group, self.device = label, tuple(ns), k, fp, group, device
        self.n = sum(ns)
        self.nbytes = self.n * k * (1 if fp else 2)
        self.copies = copies or max(1, min(8, -(-L2_BYTES // self.nbytes)))
        self.od = torch.float32 if label == "lm_head" else torch.bfloat16
        self.dtype = "fp8" if fp else "bf16"
        self.ws: list[list[Any]] = []
        for c in range(self.copies):
            parts = []
            for i, n in enumerate(ns):
                g = torch.Generator(device=device).manual_seed(100 * c + i)
                w = torch.randn(n, k, generator=g, device=device) * k ** -0.5
                parts.append(Weight(*fp8.block_quantize_weight(w)) if fp else Weight(w.to(torch.bfloat16)))
            self.ws.append(parts)

    @property
    def op_name(self) -> str:
        return op_of(self.fp, self.group)[0]

    @property
    def quant(self) -> str:
        return op_of(self.fp, self.group)[1]

    def op(self, x: Any, c: int = 0) -> Any:
        from netra.ops.linear import linear, linear_group

        return linear_group(x, self.ws[c], self.od) if self.group else linear(x, self.ws[c][0], self.od)

    def ref(self, x: Any) -> Any:
        from netra.ops.linear import linear_group_ref, linear_ref

        return linear_group_ref(x, self.ws[0], self.od) if self.group else linear_ref(x, self.ws[0][0], self.od)

    def entry(self, fn: Callable[..., Any], launch: dict[str, Any], x: Any, c: int = 0, **kw: Any) -> Any:
        """The tactic's entry called directly (``kw``: ``out_dtype``, ``xq`` / ``xs``)."""
        w = {"weights": self.ws[c]} if self.group else {"weight": self.ws[c][0]}
        return fn(launch, x=x, **w, **{"out_dtype": self.od, **kw})

    def decision(self, x: Any) -> Any:
        from netra.ops._common import route

        w0 = self.ws[0][0]
        t = {"x": x, "w": w0.data, **({"w_scale": w0.scale_inv} if self.fp and not self.group else {})}
        dims = {"m": x.shape[0], "k": self.k, "n": self.n, **({"parts": len(self.ns)} if self.group else {})}
        return route(self.op_name, t, dims, self.quant)

    def stacked(self, c: int) -> tuple[Any, Any]:
        import torch

        ws = self.ws[c]
        if len(ws) == 1:
            return ws[0].data, ws[0].scale_inv
        return (torch.cat([w.data for w in ws]).contiguous(),
                torch.cat([w.scale_inv for w in ws]).contiguous() if self.fp else None)


def make(shape: tuple[Any, ...], device: str, copies: int | None = None) -> Proj:
    label, ns, k, fp, group = shape
    return Proj(label, ns, k, fp, group, device, copies)


def pick(op: str, quant: str, m: int) -> str:
    """The contract of ``op`` / ``quant`` whose row range holds ``m`` (dispatch's choice at the model's N, K)."""
    from netra.catalog import contract_docs

    for name, doc in contract_docs("sm90", "linear").items():
        rows = doc["match"]["dims"]["m"]
        if doc["op"] == op and quant in doc["match"].get("quant", ["none"]) and rows["min"] <= m <= rows["max"]:
            return name
    raise LookupError(f"no linear contract for {op} {quant} at m={m}")


def eager_only(name: str) -> bool:
    """The contract declares no capture phase (dispatch takes the fallback inside a graph): checked and timed eagerly."""
    from netra.catalog import contract_doc

    return "capture" not in contract_doc(name)["match"].get("graph_phases", ["eager", "capture"])


def tactic(name: str) -> tuple[Callable[..., Any], dict[str, Any]]:
    """A contract's entry (its source loaded as is: compiled on a GPU, interpreted under ``--smoke``) and document."""
    from netra.catalog import contract_doc
    from netra.ops._triton import load_source

    doc = contract_doc(name)
    return getattr(load_source(doc["kernel"]["source"]), doc["kernel"]["symbol"]), doc


def check(p: Proj, m: int, gpu: bool) -> dict[str, Any]:
    """The bucket's contract (dispatch must pick it on a GPU; its entry is called on the CPU) against the reference
    under its numerics: fresh rows (output poisoned on a GPU), adversarial rows one by one (FP8), the output in FP32
    (reported), and on a GPU eager == replay (where the contract serves a capture)."""
    import torch

    from netra.bench.timing import capture
    from netra.validate.compare import compare
    from netra.validate.oracle import poison_next

    x = x_of(m, p.k, m, p.device)
    expected = pick(p.op_name, p.quant, m)
    if gpu:
        hit = p.decision(x)
        if hit is None or hit[1].contract is None or hit[1].contract.name != expected:
            return {"ok": False, "expected": expected, "chosen": hit and hit[1].contract and hit[1].contract.name}
        name, fn, launch = hit[1].contract.name, hit[1].tactic.entry, hit[1].contract.launch
        op: Callable[[Any], Any] = p.op
        poison_next((m, p.n), p.od, x.device)
    else:
        name = expected
        fn, doc = tactic(name)
        launch = doc["launch"]
        op = partial(p.entry, fn, launch)
    from netra.catalog import contract_doc

    num = contract_doc(name)["numerics"]
    got = as_list(op(x))
    out: dict[str, Any] = {"contract": name, "m": m,
                           "parts": [compare(num, a, b) for a, b in zip(got, as_list(p.ref(x)), strict=True)]}
    ok = all(v["ok"] for v in out["parts"])
    if gpu and eager_only(name):
        out["eager_only"] = True
    elif gpu:
        g, rep = capture(lambda: op(x))
        g.replay()
        torch.cuda.synchronize()
        out["eager_equals_replay"] = all(torch.equal(a, b) for a, b in zip(got, as_list(rep), strict=True))
        ok = ok and out["eager_equals_replay"]
        del g
    if p.fp:
        xa = adversarial(m, p.k, p.device)
        ga = torch.cat([t.float() for t in as_list(op(xa))], -1)
        ra = torch.cat([t.float() for t in as_list(p.ref(xa))], -1)
        one_by_one = m if m <= 128 else 4
        bad: list[Any] = [i for i in range(one_by_one) if not compare(num, ga[i], ra[i])["ok"]]
        if m > one_by_one and not compare(num, ga[one_by_one:], ra[one_by_one:])["ok"]:
            bad.append(f"rows {one_by_one}..")
        out["adversarial_bad_rows"] = bad
        ok = ok and not bad
        if p.od != torch.float32:  # the accumulation alone: the same call with an FP32 output (reported)
            g32 = torch.cat([t.float() for t in as_list(p.entry(fn, launch, x, out_dtype=torch.float32))], -1)
            r32 = torch.cat([t.float() for t in as_list(ref32(p, x))], -1)
            out["f32out"] = {a: b for a, b in compare(num, g32, r32).items() if a in ("rel_l2", "max_abs")}
    return {**out, "ok": bool(ok)}


def ref32(p: Proj, x: Any) -> Any:
    import torch

    from netra.ops.linear import linear_group_ref, linear_ref

    return linear_group_ref(x, p.ws[0], torch.float32) if p.group else linear_ref(x, p.ws[0][0], torch.float32)


# ---- GPU cases ------------------------------------------------------------------------------------

def sglang_peers(p: Proj) -> tuple[list[Any], str | None]:
    try:
        from netra.bench.peers.sglang_gemm import SglangBlockFp8Linear

        return [SglangBlockFp8Linear(*p.stacked(c), peer_root()) for c in range(p.copies)], None
    except Exception as exc:
        return [], f"{type(exc).__name__}: {exc}"


def floor_bytes(p: Proj, m: int) -> int:
    """The weight once, x read (BF16) and the output written."""
    return p.nbytes + m * p.k * 2 + m * p.n * (4 if p.label == "lm_head" else 2)


def main_case(shape: tuple[Any, ...], m: int) -> Case:
    import torch

    from netra.ops import fp8

    p = make(shape, "cuda")
    xs = [x_of(m, p.k, 100 + i, "cuda") for i in range(p.copies)]
    stacks = [p.stacked(c) for c in range(p.copies)]
    provs: dict[str, Callable[[int], Any]] = {"netra": lambda i: p.op(xs[i], i)}
    peer_error = None
    if p.fp:
        peers, peer_error = sglang_peers(p)
        if peers:
            provs["sglang"] = lambda i: peers[i].linear(xs[i])
    if p.label == "lm_head":  # cuBLAS with the engine's FP32 logits
        provs["cublas_f32out"] = lambda i: torch.mm(xs[i], stacks[i][0].t(), out_dtype=torch.float32)
    dq = [w if s is None else fp8.block_dequantize_weight(w, s, dtype=torch.bfloat16) for w, s in stacks]
    provs["cublas_bf16"] = lambda i: torch.matmul(xs[i], dq[i].t())

    def run_check() -> dict[str, Any]:
        return {**check(p, m, gpu=True), **({"peer_error": peer_error} if peer_error else {})}

    name = pick(p.op_name, p.quant, m)  # the contract the row range names; the check records dispatch's choice
    return Case(key=f"{p.label} m={m}", op=p.label, shape={"n": list(p.ns), "k": p.k, "m": m}, dtype=p.dtype,
                providers=provs, check=run_check, contract=name, n_inputs=p.copies, floor_bytes=floor_bytes(p, m),
                hold=(p, xs, stacks, dq), graph=not eager_only(name))


def prequant_case(shape: tuple[Any, ...], m: int) -> Case:
    """The FP8 call on rows a fused norm already quantized, beside SGLang's matmul on the same E4M3 rows."""
    import torch

    from netra.ops import fp8
    from netra.validate.compare import compare

    p = make(shape, "cuda")
    xs = [x_of(m, p.k, 200 + i, "cuda") for i in range(p.copies)]
    gq = [fp8.GroupQuantized(x, *fp8.quantize_per_token_group(x)) for x in xs]
    provs: dict[str, Callable[[int], Any]] = {"netra": lambda i: p.op(gq[i], i)}
    peers, peer_error = sglang_peers(p)
    if peers:
        provs["sglang_matmul"] = lambda i: peers[i].matmul(gq[i].q, gq[i].scale)
    name = pick(p.op_name, p.quant, m)

    def run_check() -> dict[str, Any]:
        from netra.catalog import contract_doc

        got, plain = as_list(p.op(gq[0])), as_list(p.op(xs[0]))
        res: dict[str, Any] = {
            "parts": [compare(contract_doc(name)["numerics"], a, b) for a, b in zip(got, as_list(p.ref(xs[0])),
                                                                                   strict=True)],
            "equals_bf16_input": [compare({"policy": "bitwise"}, a, b)["ok"] for a, b in zip(got, plain, strict=True)]}
        if peer_error:
            res["peer_error"] = peer_error
        ok = all(v["ok"] for v in res["parts"]) and all(res["equals_bf16_input"])
        return {**res, "ok": ok and bool(torch.isfinite(torch.cat([t.float() for t in got], -1)).all())}

    return Case(key=f"{p.label} m={m} x=e4m3", op=p.label + "_prequant", shape={"n": list(p.ns), "k": p.k, "m": m},
                dtype="fp8", providers=provs, check=run_check, contract=name, n_inputs=p.copies,
                floor_bytes=floor_bytes(p, m) + m * p.k // 2, hold=(p, xs, gq))


def explore_case(shape: tuple[Any, ...], m: int) -> Case:
    """Launch candidates of the bucket's contract beside it (no contract: information only)."""
    from netra.validate.compare import compare

    p = make(shape, "cuda")
    xs = [x_of(m, p.k, 300 + i, "cuda") for i in range(p.copies)]
    hit = p.decision(xs[0])
    if hit is None or hit[1].contract is None:
        raise RuntimeError("dispatch chose the fallback")
    fn, base = hit[1].tactic.entry, hit[1].contract.launch
    cands = {f"c{j}": launch_of(base, ov) for j, ov in enumerate(CANDIDATES[m])}
    provs: dict[str, Callable[[int], Any]] = {"netra": lambda i: p.op(xs[i], i)}
    def candidate(ln: dict[str, Any]) -> Callable[[int], Any]:
        return lambda i: p.entry(fn, ln, xs[i], i)

    provs.update({c: candidate(ln) for c, ln in cands.items()})
    peers, peer_error = sglang_peers(p)
    if peers:
        from netra.ops import fp8

        q = [fp8.quantize_per_token_group(x) for x in xs]
        provs["sglang"] = lambda i: peers[i].linear(xs[i])
        provs["sglang_matmul"] = lambda i: peers[i].matmul(*q[i])
    quant = getattr(hit[1].tactic.module, "quantize_rows", None)
    if quant is not None:  # the quantization pre-kernel alone (its share of the call)
        provs["act_quant"] = lambda i: quant(xs[i])
    num = hit[1].contract.numerics

    def run_check() -> dict[str, Any]:
        """Each candidate against the reference, adversarial rows one by one and run to run; a failing one is
        dropped from the timing and listed."""
        import torch

        ref, xa = as_list(p.ref(xs[0])), adversarial(m, p.k, "cuda")
        ra = torch.cat([t.float() for t in as_list(p.ref(xa))], -1)
        res: dict[str, Any] = {"contract": hit[1].contract.name, "candidates": {}, "dropped": [],
                               **({"peer_error": peer_error} if peer_error else {})}
        for c, ln in cands.items():
            try:
                a, b = as_list(p.entry(fn, ln, xs[0])), as_list(p.entry(fn, ln, xs[0]))
                ga = torch.cat([t.float() for t in as_list(p.entry(fn, ln, xa))], -1)
                v = {"override": CANDIDATES[m][int(c[1:])],
                     "parts": [compare(num, g, r)["rel_l2"] for g, r in zip(a, ref, strict=True)],
                     "ok": all(compare(num, g, r)["ok"] for g, r in zip(a, ref, strict=True)),
                     "run_to_run": all(torch.equal(g, h) for g, h in zip(a, b, strict=True)),
                     "adversarial_bad_rows": [i for i in range(min(m, 4)) if not compare(num, ga[i], ra[i])["ok"]]}
                v["ok"] = v["ok"] and v["run_to_run"] and not v["adversarial_bad_rows"]
            except Exception as exc:
                v = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            res["candidates"][c] = v
            if not v["ok"]:
                res["dropped"].append(c)
                del provs[c]
        base_ok = all(compare(num, g, r)["ok"] for g, r in zip(as_list(p.op(xs[0])), ref, strict=True))
        return {**res, "ok": base_ok}

    return Case(key=f"{p.label} m={m} (exploration)", op=p.label + "_exploration",
                shape={"n": list(p.ns), "k": p.k, "m": m}, dtype="fp8", providers=provs, check=run_check,
                n_inputs=p.copies, floor_bytes=floor_bytes(p, m), hold=(p, xs))


def rows_of(opts: argparse.Namespace) -> list[int]:
    return [int(v) for v in str(getattr(opts, "linear_rows", "") or ",".join(map(str, ROWS))).split(",")]


def in_range(shape: tuple[Any, ...], m: int) -> bool:
    """A contract serves the shape at ``m`` (lm_head: decode rows only)."""
    return m <= 128 or shape[0] != "lm_head"


def cases(opts: argparse.Namespace) -> Iterator[CaseBuilder]:
    """Ordered for ``--deadline`` (no case starts after it): every kind of case early, the issue's rows first.
    The contracts' cases at m = 1, 128 (the issue's) and the largest prefill row count, the pre-quantized call at the
    first of those, then the other rows, the other pre-quantized calls, and the explorations."""
    rows = rows_of(opts)
    first = [m for m in (1, 128, max(rows)) if m in rows]
    first = sorted(set(first), key=first.index)
    rest = [m for m in rows if m not in first]
    fp8_shapes = [s for s in SHAPES if s[3]]
    for m in first:
        yield from (partial(main_case, s, m) for s in SHAPES if in_range(s, m))
    yield from (partial(prequant_case, s, first[0]) for s in fp8_shapes)
    for m in rest:
        yield from (partial(main_case, s, m) for s in SHAPES if in_range(s, m))
    for m in first[1:] + rest:
        yield from (partial(prequant_case, s, m) for s in fp8_shapes)
    if getattr(opts, "linear_explore", False):
        for m in rows:
            yield from (partial(explore_case, s, m) for s in fp8_shapes
                        if m in CANDIDATES)


def smoke_case(shape: tuple[Any, ...], m: int) -> Case:
    p = make(shape, "cpu", copies=1)
    return Case(key=f"{p.label} m={m}", op=p.label, shape={"n": list(p.ns), "k": p.k, "m": m}, dtype=p.dtype,
                check=partial(check, p, m, False), contract=pick(p.op_name, p.quant, m))


def smoke() -> Iterator[CaseBuilder]:
    """One row count per m-bucket, each shape where a Triton contract serves it (the lm_head at m <= 32: above,
    its contract is cuBLAS with an FP32 output, which the CPU has not)."""
    for shape in SMOKE_SHAPES:
        for m in SMOKE_ROWS:
            if in_range(shape, m) and (shape[0] != "lm_head" or m <= 32):
                yield partial(smoke_case, shape, m)


def targets(record: dict[str, Any]) -> dict[str, Any]:
    """Issue 19: each FP8 projection at least as fast as its best measured peer at batch 1 and batch 128."""
    out: dict[str, Any] = {}
    for label, *_ in SHAPES[:3]:
        for m in (1, 128):
            rows = {r["provider"]: r for r in record["rows"] if r["op"] == label and r["shape"].get("m") == m}
            ours, peer = rows.get("netra"), rows.get("sglang")
            out[f"{label} m={m}: netra <= sglang"] = {
                "pass": bool(ours and peer and ours["median_us"] <= peer["median_us"]),
                "netra_us": ours["median_us"] if ours else None, "sglang_us": peer["median_us"] if peer else None,
                "netra_floor_fraction": ours.get("floor_fraction") if ours else None}
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--linear-rows", default="", help=f"linear: comma-separated row counts (default {ROWS})")
    p.add_argument("--linear-explore", action="store_true",
                   help="linear: also time launch candidates of each FP8 bucket (the tuning sweep)")


def setup(opts: argparse.Namespace) -> dict[str, Any]:
    if getattr(opts, "smoke", False):
        return {"entries": "the contracts' entries under the interpreter"}
    from netra import dispatch

    dispatch.reset(dispatch.Dispatcher(min_maturity="experiment"))
    out: dict[str, Any] = {"min_maturity": "experiment", "sglang_peer_root": str(peer_root())}
    try:
        from netra.bench.peers import sglang_gemm

        out["sglang_notes"] = list(sglang_gemm.RUN_NOTES)
    except Exception as exc:
        out["sglang_error"] = f"{type(exc).__name__}: {exc}"
    return out


SPEC = Spec(name="linear", family="linear", doc="dense projections (FP8 block, BF16, groups) vs SGLang and cuBLAS",
            cases=cases, smoke=smoke, contracts=CONTRACTS, setup=setup, targets=targets, add_arguments=add_arguments)
