"""The prefill MoE block (contract ``moe_block_prefill``, the Triton module kernels/sm90/moe/moe_prefill.py, 129..8192
tokens, eager) checked against its oracle and timed beside SGLang 0.5.23's block under the one harness.

Layer: as the ``moe`` spec (`netra.bench.specs.moe.moe_layer`: the seeded Qwen3.6 layer 0 block). Dispatch runs at
experiment maturity (the contract is an experiment); the op is called as the engine calls it (`netra.ops.moe.moe`).

Cases: 256 (checked), 1024 and 4096 tokens (checked and timed; ``--moe-prefill-tokens`` for others, 8192 included).

Check (`check`, the same code on the GPU and in the smoke path; device, layer and provider are parameters): a fresh
random chunk, and at 1024 tokens (the smoke path: every count) also mixed (zero, 1e-3 and 300x rows in one chunk),
1e-3, 300x, outlier-group inputs and router ties; each output (poisoned first on the GPU) judged by
`netra.validate.compare` under the contract's numerics against ``moe_ref``; finite; run to run bitwise; the
routing judged apart: the tactic's own router kernel's logits ranked as the oracle ranks them, against the
oracle's ids (`routing_agreement`: near-ties allowed, errors not); on the GPU dispatch must pick the contract.

Providers (eager: the contract claims no capture, and the engine runs prefill eagerly; 2 rotated inputs, the
expert weights being far past the L2): ``netra`` (the engine's op, dispatch picking the contract, as checked)
and ``sglang`` (the peer's ``block``: its fused_experts pipeline with its tuned configs). Floor: every
expert's, the shared expert's and the router's bytes once, x in and out, over the copy rate of the run.

Smoke (CPU, ``--smoke``): the same `check` with the contract's Triton entry under the interpreter (router with the
x quantization, route/sort/align, the grouped gate_up and down GEMMs, the route sum) on a small layer (16 experts
top-4, hidden 256, width 128) at 40 tokens, every input kind. It covers the Triton kernels' arithmetic and
routing against the oracle, the harness and the comparison; only the GPU run covers the compiled kernels at the
model's shape, dispatch's choice, the peer and the timing.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Iterator
from typing import Any

from netra.bench.harness import Case, CaseBuilder, Spec, entry
from netra.bench.specs import moe

CONTRACT = "moe_block_prefill"
CHECK_TOKENS = (256,)
TIME_TOKENS = (1024, 4096)
ADVERSARIAL_AT = 1024
KINDS = ("normal", "mixed", "tiny", "large", "outlier", "ties")
SMOKE_TOKENS = (40,)

Run = Callable[[Any, Any], Any]  # (x, layer) -> out


def engine_run() -> Run:
    """The engine's op through dispatch."""
    from netra.ops.moe import moe as op

    return op


def entry_run() -> Run:
    """The contract's entry called directly with its launch (the interpreter on the CPU)."""
    fn, _ = entry(CONTRACT)
    return lambda x, w: fn(x=x, weights=w)


def tactic_logits(x: Any, w: Any) -> Any:
    """The tactic's own router kernel's BF16 logits [T, E + 1] (the last column: the shared expert's gate)."""
    import torch

    from netra.catalog import contract_doc
    from netra.ops import _triton

    mod = _triton.load_source(contract_doc(CONTRACT)["kernel"]["source"])
    m, hidden = x.shape
    e = w.num_experts
    logits = torch.empty(m, e + 1, dtype=torch.bfloat16, device=x.device)
    xq = torch.empty(m, hidden, dtype=torch.float8_e4m3fn, device=x.device)
    xs = torch.empty(m, hidden // 128, dtype=torch.float32, device=x.device)
    mod._router_kernel[(-(-(e + 1) // 64), -(-m // 64))](x, w.router.data, w.shared_gate.data, logits, xq, xs, m, e,
                                                        hidden, BLOCK_M=64, BLOCK_N=64, BLOCK_K=64)
    return logits


def check(m: int, layer: Any, ties: Any, device: str, run: Run, kinds: tuple[str, ...] | None = None,
          expect: bool = False) -> dict[str, Any]:
    """``run`` on a fresh chunk (and the adversarial ones at `ADVERSARIAL_AT`, or ``kinds``) of ``m`` tokens, judged
    under the contract's numerics against ``moe_ref``, run to run bitwise, finite, the routing apart; ``expect``:
    dispatch must pick the contract."""
    import torch

    from netra.catalog import contract_doc
    from netra.ops.linear import linear_ref
    from netra.ops.moe import moe_ref, moe_route_ref, routing_agreement
    from netra.validate.compare import compare
    from netra.validate.oracle import poison_next

    numerics = contract_doc(CONTRACT)["numerics"]
    hidden = layer.router.data.shape[1]
    kinds = kinds or (KINDS if m == ADVERSARIAL_AT else KINDS[:1])
    out: dict[str, Any] = {"contract": CONTRACT, "policy": numerics["policy"], "cases": []}
    if expect:
        out["selected"] = moe.selected("block", moe.inputs(m, 1, "normal", device, hidden), layer)
    for i, kind in enumerate(kinds):
        w = ties if kind == "ties" else layer
        x = moe.inputs(m, 1000 * m + i, "normal" if kind == "ties" else kind, device, hidden)
        if device != "cpu":
            poison_next((m, hidden), torch.bfloat16, x.device)
        got = run(x, w)
        again = run(x, w)
        logits = linear_ref(x, w.router, torch.bfloat16)
        _, ref_ids = moe_route_ref(logits, w.top_k, w.renormalize)
        _, own_ids = moe_route_ref(tactic_logits(x, w)[:, :w.num_experts], w.top_k, w.renormalize)
        case: dict[str, Any] = {"input": kind, "compare": compare(numerics, got, moe_ref(x, w)),
                "run_to_run_bitwise": bool(torch.equal(got, again)), "finite": bool(torch.isfinite(got).all()),
                "routing": routing_agreement(logits.cpu(), own_ids.cpu(), ref_ids.cpu())}
        case["ok"] = bool(case["compare"]["ok"] and case["run_to_run_bitwise"] and case["finite"]
                          and case["routing"]["errors"] == 0)
        out["cases"].append(case)
    out["failing"] = [c["input"] for c in out["cases"] if not c["ok"]]
    out["worst_rel_l2"] = max(c["compare"]["rel_l2"] for c in out["cases"])
    out["ok"] = not out["failing"] and out.get("selected", CONTRACT) == CONTRACT
    return out


def floor_bytes(m: int) -> int:
    return 257 * moe.EXPERT_BYTES + moe.ROUTER_BYTES + 2 * m * moe.HIDDEN * 2


def gpu_case(m: int, timed: bool) -> Case:
    w, ties = moe._STATE["layer"], moe._STATE["ties"]
    case = Case(key=f"block tokens={m}", op="moe_fp8_block", shape={"tokens": m}, dtype="fp8_e4m3_block128",
                check=functools.partial(check, m, w, ties, "cuda", engine_run(), expect=True), contract=CONTRACT,
                graph=False, min_calls=4)
    if timed:
        xs = [moe.inputs(m, 7 * i + m) for i in range(2)]
        run = engine_run()
        provs: dict[str, Callable[[int], Any]] = {"netra": lambda i: run(xs[i], w)}
        peer = moe._STATE.get("peer")
        if peer is not None:
            provs["sglang"] = lambda i: peer.block(xs[i])
        case.providers, case.n_inputs, case.hold, case.floor_bytes = provs, 2, xs, floor_bytes(m)
    return case


def cases(opts: argparse.Namespace) -> Iterator[CaseBuilder]:
    timed = [int(v) for v in getattr(opts, "moe_prefill_tokens", "").split(",") if v] or list(TIME_TOKENS)
    for m in timed:
        yield functools.partial(gpu_case, m, True)
    for m in CHECK_TOKENS:
        if m not in timed:
            yield functools.partial(gpu_case, m, False)


def setup(opts: argparse.Namespace) -> dict[str, Any]:
    """As the ``moe`` spec's (the layer and the peer), loaded once if both specs run."""
    if getattr(opts, "smoke", False) or "layer" not in moe._STATE:
        info = moe.setup(opts)
    else:
        info = {"min_maturity": "experiment", "layer": "qwen36-35b-a3b layer 0 (seed 0)"}
    return info


def smoke_case(m: int) -> Case:
    layer = moe.small_layer(1)
    chk = functools.partial(check, m, layer, moe.with_router_ties(layer), "cpu", entry_run(), kinds=KINDS)
    return Case(key=f"block tokens={m}", op="moe_fp8_block", shape={"tokens": m, **moe.SMALL},
                dtype="fp8_e4m3_block128", check=chk, contract=CONTRACT)


def smoke() -> Iterator[CaseBuilder]:
    for m in SMOKE_TOKENS:
        yield functools.partial(smoke_case, m)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--moe-prefill-tokens", default="", help=f"moe_prefill: timed token counts (default {TIME_TOKENS})")


SPEC = Spec(name="moe_prefill", family="moe", doc="prefill MoE block (Triton, 129..8192 tokens) against SGLang's",
            cases=cases, smoke=smoke, setup=setup, contracts=(CONTRACT,), add_arguments=add_arguments, samples=15)

def check_contract(contract: Any, w: Any, ties: Any, tokens: tuple[int, ...]) -> dict[str, Any]:
    """``moe_block_prefill`` checked as the engine calls it at every count of ``tokens`` in its range (GPU), every
    input kind: the GPU tests' entry (the decode contracts': `netra.bench.specs.moe.check_contract`)."""
    res = {m: check(m, w, ties, "cuda", engine_run(), kinds=KINDS, expect=True)
           for m in tokens if contract.dims["tokens"].contains(m)}
    failing = [{"tokens": m, **r} for m, r in res.items() if not r["ok"]]
    return {"contract": contract.name, "cases": sum(len(r["cases"]) for r in res.values()), "failing": failing,
            "ok": bool(res) and not failing}
