"""The MoE block and the routed experts at decode sizes (kernels/sm90/moe, issues 7 and 18), checked and timed
against SGLang 0.5.23's own pipeline (`netra.bench.peers.sglang_moe`) under the one harness.

Layer: layer 0's MoE block of the seeded full Qwen3.6 preset (the engine's own initialiser; 256 experts top-8,
hidden 2048, width 512, E4M3 with 128 x 128 block scales, the gated shared expert).

Cases: ``block`` (op ``moe_fp8_block``: router + top-8 + routed + gated shared expert) and ``routed`` (op
``moe_fp8_routed``: the experts from given top-8) at 1, 2, 4, 8, 16, 32, 64, 128 tokens (timed) and 3, 5, 33, 127
(checked only: half-filled warps, passes and chunks); the contract of a case is the one dispatch picks there. Every
other contract of the two ops (the two-launch ``moe_block_stream``, which the one-launch fold outranks) is checked
on its own at 2, 33 and 128 tokens through its own tactic (its outputs also compared bitwise with the picked
contract's: ``bitwise_vs_selected``, recorded), and timed as a provider beside the contract dispatch picks
(``netra:<contract>``).

Check (`check`, the same code on the GPU and in the smoke path; device, layer and provider are parameters): fresh
random inputs at every count, and at 1, 8 and 128 tokens also router ties (router rows 2j and 2j + 1 equal), zero,
1e-3, 300x and outlier-group inputs; each output (poisoned first) judged by `netra.validate.compare` under the
contract's numerics against its oracle (the contract's ``numerics.oracle``); the block judged on its own routing
(the top-8 the tactic's route step wrote), the routing judged apart by `routing_agreement` (near-ties allowed,
errors not); run to run bitwise; on the GPU also eager == CUDA-graph replay bitwise and dispatch picking the case's
contract. At the timed counts the peer's output is judged against the oracle too (``peer`` in the check, recorded,
not deciding: a wrong peer would make its time meaningless).

Providers (timed, graph replay over 8 rotated input sets: their experts' weights exceed the L2 together):
``netra`` (the engine's op through dispatch), ``sglang`` (the peer's ``block`` / ``routed``; absent, with the
reason in ``setup.peer``, when its staged files are missing) and the other contracts' tactics. Floor: the bytes of
the experts the call's routing selects, the shared expert and router (block), x in and out, over the copy rate
measured in the run. Issue 18's thresholds (`TARGETS`) are reported in ``targets``.

Smoke (CPU, ``--smoke``): the same `check` on a small layer (16 experts top-4, width 128; hidden 256 for the block,
2048 for the routed experts, whose oracle is written for it) at 1, 5, 8 (block) and 1, 3 tokens (routed) with every
input kind, with a
provider the CPU runs that is not the oracle itself: for the block the engine's op, which dispatch sends to its
dense fallback there (`moe_dense_ref`); for the routed experts `routed_composed` (the block oracle's per-expert
arithmetic) against ``moe_routed_ref``. It covers the harness, the inputs, the routing judgement, the comparison and the oracles'
agreement; only the GPU run covers the CUDA code objects, dispatch's choice, graph replay, the peer and the timing.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import os
from collections.abc import Callable, Iterator
from typing import Any

from netra.bench.harness import Case, CaseBuilder, Spec

TOKENS = (1, 2, 4, 8, 16, 32, 64, 128)
CHECK_TOKENS = (3, 5, 33, 127)  # checked only
OTHER_AT = (2, 33, 128)  # the contracts dispatch does not pick, checked through their own tactic
ADVERSARIAL_AT = (1, 8, 128)
KINDS = ("normal", "ties", "zero", "large", "tiny", "outlier")
N_INPUTS = 8  # rotated input sets per provider
HIDDEN = 2048
EXPERT_BYTES = 1024 * 2048 + 8 * 16 * 4 + 2048 * 512 + 16 * 4 * 4  # w13 + w2 + their scales
ROUTER_BYTES = 256 * 2048 * 2 + 2048 * 2
OPS = {"block": "moe_fp8_block", "routed": "moe_fp8_routed"}
# Issue 18's thresholds: name -> (section, tokens, metric, need); reported beside the promotion rule.
TARGETS = {"block_1_token": ("block", 1, "speedup", 1.8), "block_8_tokens": ("block", 8, "speedup", 1.15),
           "block_floor_128": ("block", 128, "floor_fraction", 0.93),
           "routed_1_token": ("routed", 1, "speedup", 1.9), "routed_floor_128": ("routed", 128, "floor_fraction", 0.95)}
SMOKE = (("block", 1), ("block", 5), ("block", 8), ("routed", 1), ("routed", 3))
SMALL = {"experts": 16, "top_k": 4, "hidden": 256, "width": 128}

Run = Callable[[Any, Any, Any, Any], Any]  # (x, layer, ids, weights) -> out; the block ignores ids / weights

_STATE: dict[str, Any] = {}


# ---- the layer and its inputs (shared with the prefill spec, the step benchmark and the GPU tests) ----------


def moe_layer(seed: int = 0, device: str = "cuda") -> Any:
    """Layer 0's MoE block of the seeded full Qwen3.6 preset (the engine's own initialiser)."""
    from netra.engine.config import preset
    from netra.engine.weights import seeded_moe

    return seeded_moe(preset("qwen36-35b-a3b"), seed, device)


def small_layer(seed: int = 0, experts: int = 16, top_k: int = 4, hidden: int = 256, width: int = 128) -> Any:
    """A small layer of the same form (E4M3 experts with 128 x 128 block scales) for the CPU smoke paths."""
    import torch

    from netra.ops import fp8
    from netra.ops.linear import Weight
    from netra.ops.moe import MoEWeights

    g = torch.Generator().manual_seed(seed)

    def q(t: Any) -> Any:
        return Weight(*fp8.block_quantize_weight(t))

    w13 = torch.randn(experts, 2 * width, hidden, generator=g) / hidden ** 0.5
    w13[2] *= 30.0  # one expert with large weights (its own block scales)
    return MoEWeights(router=Weight((torch.randn(experts, hidden, generator=g) / hidden ** 0.5).bfloat16()),
                      w13=q(w13), w2=q(torch.randn(experts, hidden, width, generator=g) / width ** 0.5),
                      shared_w13=q(torch.randn(2 * width, hidden, generator=g) / hidden ** 0.5),
                      shared_w2=q(torch.randn(hidden, width, generator=g) / width ** 0.5),
                      shared_gate=Weight((torch.randn(1, hidden, generator=g) / hidden ** 0.5).bfloat16()),
                      top_k=top_k, renormalize=True)


def inputs(m: int, seed: int, kind: str = "normal", device: str = "cuda", hidden: int = HIDDEN) -> Any:
    """x [m, hidden] BF16: normal, zero, large (300x), tiny (1e-3), outlier (every 128th column 1000x), mixed
    (zero, tiny and large rows in one chunk)."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(m, hidden, generator=g, device=device)
    if kind == "zero":
        x.zero_()
    elif kind == "large":
        x *= 300.0
    elif kind == "tiny":
        x *= 1e-3
    elif kind == "outlier":
        x[:, ::128] *= 1000.0
    elif kind == "mixed":
        x[0::5] = 0.0
        x[1::5] *= 1e-3
        x[2::5] *= 300.0
    return x.to(torch.bfloat16)


def with_router_ties(w: Any) -> Any:
    """The same layer with router rows 2j and 2j + 1 equal (j < 64): exact logit ties everywhere."""
    from netra.ops.linear import Weight

    r = w.router.data.clone()
    half = min(128, r.shape[0])
    r[1:half:2] = r[0:half:2]
    return dataclasses.replace(w, router=Weight(r))


def routing(w: Any, x: Any) -> tuple[Any, Any]:
    """The reference's top-k (ids int32, renormalised FP32 weights) for x."""
    import torch

    from netra.ops.linear import linear_ref
    from netra.ops.moe import moe_route_ref

    wts, ids = moe_route_ref(linear_ref(x, w.router, torch.bfloat16), w.top_k, w.renormalize)
    return ids.to(torch.int32).contiguous(), wts.float().contiguous()


def tactic_routing(x: Any) -> tuple[Any, Any]:
    """The top-8 the block tactic's route step wrote for its last call on x's device (ids, weights; its 9th route,
    the shared expert's gate, is judged through the output against the oracle's own gate)."""
    from netra.ops import moe_sm90

    b = moe_sm90._bufs(x.device)
    m = x.shape[0]
    return b.topk_ids[:m, :8].clone(), b.topk_w[:m, :8].clone()


def floor_bytes(ids: Any, m: int, shared: bool) -> int:
    """Bytes a call must move: each selected expert's weights once, the shared expert and router (block), x in
    and out."""
    n = int(ids.unique().numel())
    return n * EXPERT_BYTES + (EXPERT_BYTES + ROUTER_BYTES if shared else 0) + 2 * m * HIDDEN * 2


def oracle(numerics: Any) -> Callable[..., Any]:
    """The reference function a contract's ``numerics.oracle`` names (``module:function``)."""
    mod, _, fn = str(numerics["oracle"]).partition(":")
    return getattr(importlib.import_module(mod), fn)  # type: ignore[no-any-return]


def contracts(section: str) -> list[Any]:
    """The sm90 contracts of the section's op, highest maturity first (dispatch's rank among equals)."""
    from netra.catalog import Catalog

    rank = {"accepted": 0, "verified": 1, "experiment": 2}
    cs = [c for c in Catalog.load().contracts if c.target == "sm90" and c.op == OPS[section]
          and c.maturity in rank and "tokens" in c.dims]
    return sorted(cs, key=lambda c: rank[c.maturity])


def contract_for(section: str, m: int) -> str:
    """The contract dispatch picks for ``m`` tokens (the highest maturity whose range holds ``m``)."""
    for c in contracts(section):
        if c.dims["tokens"].contains(m):
            return str(c.name)
    raise LookupError(f"no sm90 {OPS[section]} contract for {m} tokens")


# ---- the check (GPU and smoke) -----------------------------------------------------------------------------


def engine_run(section: str) -> Run:
    """The engine's op through dispatch (a tactic on the GPU, the fallback on the CPU)."""
    from netra.ops.moe import moe, moe_routed

    if section == "block":
        return lambda x, w, ids, tw: moe(x, w)
    return lambda x, w, ids, tw: moe_routed(x, w.w13.data, w.w13.scale_inv, w.w2.data, w.w2.scale_inv, ids, tw)


def routed_composed(x: Any, w: Any, ids: Any, tw: Any) -> Any:
    """The routed experts composed from the block oracle's own per-expert arithmetic (`expert_mlp_ref`, each route
    rounded to BF16, summed in FP32 in rank order): a second formulation beside ``moe_routed_ref`` (the smoke
    path's provider for the routed op, where the engine's op would run that oracle itself)."""
    import torch

    from netra.ops._common import acc_dtype
    from netra.ops.moe import _expert, expert_mlp_ref

    acc = acc_dtype(x.device)
    routes = torch.zeros(x.shape[0], ids.shape[1], x.shape[1], dtype=torch.bfloat16, device=x.device)
    for e in ids.unique().tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        routes[tok, slot] = expert_mlp_ref(x[tok], _expert(w.w13, e, acc), _expert(w.w2, e, acc), tw[tok, slot],
                                           w.w13.is_fp8)
    return routes.float().sum(dim=1).to(x.dtype)


def tactic_run(section: str, contract: str) -> Run:
    """One contract's tactic called directly, whatever dispatch would pick (the other contracts' checks and
    timing)."""
    import torch

    from netra.catalog import Catalog
    from netra.dispatch import Decision
    from netra.ops.moe import _launch_block, _launch_routed
    from netra.runtime import load_tactic

    c = Catalog.load().by_name(contract)
    d = Decision(tactic=load_tactic(c, torch.cuda.current_device()), contract=c, reason=f"{contract} (direct)")
    if section == "block":
        return lambda x, w, ids, tw: _launch_block(d, x=x, weights=w)
    return lambda x, w, ids, tw: _launch_routed(d, x=x, w13=w.w13.data, w13_scale=w.w13.scale_inv, w2=w.w2.data,
                                                w2_scale=w.w2.scale_inv, topk_ids=ids, topk_w=tw)


def selected(section: str, x: Any, w: Any) -> str:
    """The contract dispatch picks for this call (or "fallback")."""
    from netra.ops._common import route
    from netra.ops.moe import FP8_QUANT, ROUTED_OP, _block_call

    if section == "block":
        op, tensors, dims, quant = _block_call(x, w)
    else:
        ids, tw = routing(w, x)
        op, quant = ROUTED_OP, FP8_QUANT
        tensors = {"x": x, "w13": w.w13.data, "w2": w.w2.data, "topk_ids": ids, "topk_w": tw}
        dims = {"tokens": x.shape[0], "hidden": x.shape[1], "experts": w.num_experts, "top_k": w.top_k,
                "inter": w.w2.data.shape[2]}
    hit = route(op, tensors, dims, quant=quant, reduction_order="fixed")
    return hit[1].contract.name if hit is not None and hit[1].contract is not None else "fallback"


def check(section: str, m: int, contract: str, layer: Any, ties: Any, run: Run, device: str,
          kinds: tuple[str, ...] | None = None, own_routing: Callable[[Any], tuple[Any, Any]] | None = None,
          expect: bool = False, peer: Run | None = None, twin: Run | None = None) -> dict[str, Any]:
    """``run`` on fresh and adversarial inputs at ``m`` tokens, each output judged under ``contract``'s numerics
    against its oracle: the block on its own routing (``own_routing(x)``: the tactic's top-k; the reference's
    when None) with the routing judged apart, run to run bitwise, on the GPU eager == graph replay; ``expect``:
    dispatch must pick ``contract``; ``peer``: judged against the oracle as well (recorded, not deciding); ``twin``:
    another plan of the same arithmetic (the contract dispatch picks), bitwise against it (recorded, not deciding:
    the A/B of the one-launch fold and the two-launch block)."""
    import torch

    from netra.catalog import contract_doc
    from netra.ops.linear import linear_ref
    from netra.ops.moe import routing_agreement
    from netra.validate.compare import compare
    from netra.validate.oracle import poison_next

    numerics = contract_doc(contract)["numerics"]
    ref_fn = oracle(numerics)
    hidden = layer.router.data.shape[1]
    gpu = device != "cpu"
    kinds = kinds or (KINDS if m in ADVERSARIAL_AT else KINDS[:1])
    out: dict[str, Any] = {"contract": contract, "policy": numerics["policy"], "cases": []}
    if expect:
        out["selected"] = selected(section, inputs(m, 1, "normal", device, hidden), layer)
    for i, kind in enumerate(kinds):
        w = ties if kind == "ties" else layer
        x = inputs(m, 1000 * m + i, "normal" if kind == "ties" else kind, device, hidden)
        ids, tw = routing(w, x)
        if gpu:
            poison_next((m, hidden), torch.bfloat16, x.device)
        got = run(x, w, ids, tw)
        case: dict[str, Any] = {"input": kind}
        if section == "block":
            own_ids, own_w = own_routing(x) if own_routing is not None else (ids, tw)
            case["routing"] = routing_agreement(linear_ref(x, w.router, torch.bfloat16), own_ids, ids)
            ref = ref_fn(x, w, routing=(own_w, own_ids))
        else:
            ref = ref_fn(x, ids, tw, w.w13.data, w.w13.scale_inv, w.w2.data, w.w2.scale_inv)
        case["compare"] = compare(numerics, got, ref)
        case["run_to_run_bitwise"] = bool(torch.equal(got, run(x, w, ids, tw)))
        if gpu:
            from netra.bench.timing import capture

            g, replayed = capture(functools.partial(run, x, w, ids, tw))
            replayed.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            case["eager_equals_replay"] = bool(torch.equal(got, replayed))
            del g
        if twin is not None:
            case["bitwise_vs_selected"] = bool(torch.equal(got, twin(x, w, ids, tw)))
        if peer is not None and kind == "normal":
            case["peer"] = compare(numerics, peer(x, w, ids, tw), ref_fn(x, w) if section == "block" else ref)
        case["ok"] = bool(case["compare"]["ok"] and case["run_to_run_bitwise"]
                          and case.get("eager_equals_replay", True) and not case.get("routing", {}).get("errors"))
        out["cases"].append(case)
    out["failing"] = [c["input"] for c in out["cases"] if not c["ok"]]
    if gpu:
        out["eager_equals_replay"] = all(c["eager_equals_replay"] for c in out["cases"])
    out["worst_rel_l2"] = max(c["compare"]["rel_l2"] for c in out["cases"])
    out["ok"] = not out["failing"] and out.get("selected", contract) == contract
    return out


def check_contract(contract: Any, w: Any, ties: Any, tokens: tuple[int, ...] = TOKENS + CHECK_TOKENS
                   ) -> dict[str, Any]:
    """One contract checked through its own tactic at every count of ``tokens`` in its range (GPU): the GPU
    tests' entry. The prefill contract's is `netra.bench.specs.moe_prefill.check_contract` (that spec imports
    this one, not the other way round)."""
    if contract.name == "moe_block_prefill":
        raise ValueError("moe_block_prefill is checked by netra.bench.specs.moe_prefill.check_contract")
    section = "block" if contract.op == OPS["block"] else "routed"
    run = tactic_run(section, contract.name)
    own = tactic_routing if section == "block" else None
    res = {m: check(section, m, contract.name, w, ties, run, "cuda", own_routing=own)
           for m in tokens if contract.dims["tokens"].contains(m)}
    failing = [{"tokens": m, **r} for m, r in res.items() if not r["ok"]]
    return {"contract": contract.name, "cases": sum(len(r["cases"]) for r in res.values()), "failing": failing,
            "ok": bool(res) and not failing}


# ---- the GPU run -------------------------------------------------------------------------------------------


def peer_run(section: str) -> Run | None:
    peer = _STATE.get("peer")
    if peer is None:
        return None
    if section == "block":
        return lambda x, w, ids, tw: peer.block(x)
    return lambda x, w, ids, tw: peer.routed(x, ids, tw)


def gpu_case(section: str, m: int, timed: bool, contract: str | None = None) -> Case:
    """A case through dispatch (``contract`` None: the one it picks; timed) or one other contract's tactic
    (checked only)."""
    w, ties = _STATE["layer"], _STATE["ties"]
    direct = contract is not None
    name = contract or contract_for(section, m)
    run = tactic_run(section, name) if direct else engine_run(section)
    own = tactic_routing if section == "block" else None
    chk = functools.partial(check, section, m, name, w, ties, run, "cuda", own_routing=own, expect=not direct,
                            peer=peer_run(section) if timed else None, twin=engine_run(section) if direct else None)
    case = Case(key=f"{section} tokens={m}" + (f" {name}" if direct else ""), op=OPS[section],
                shape={"tokens": m}, dtype="fp8_e4m3_block128", check=chk, contract=name)
    if timed:
        xs = [inputs(m, 7 * i + m) for i in range(N_INPUTS)]
        routes = [routing(w, x) for x in xs]

        def prov(fn: Run) -> Callable[[int], Any]:
            return lambda i: fn(xs[i], w, *routes[i])

        others = {f"netra:{c.name}": tactic_run(section, c.name) for c in contracts(section)
                  if c.name != name and c.dims["tokens"].contains(m) and c.maturity != "rejected"}
        peer = peer_run(section)
        case.providers = {"netra": prov(run), **({"sglang": prov(peer)} if peer is not None else {}),
                          **{p: prov(f) for p, f in others.items()}}
        case.n_inputs, case.hold = N_INPUTS, (xs, routes)
        case.floor_bytes = sum(floor_bytes(ids, m, section == "block") for ids, _ in routes) / N_INPUTS
    return case


def _ints(s: str, default: tuple[int, ...]) -> list[int]:
    return [int(v) for v in s.split(",") if v] if s else list(default)


def cases(opts: argparse.Namespace) -> Iterator[CaseBuilder]:
    timed = _ints(getattr(opts, "moe_tokens", ""), TOKENS)
    for section in ("block", "routed"):
        for m in timed:
            yield functools.partial(gpu_case, section, m, True)
    for section in ("block", "routed"):
        for m in CHECK_TOKENS:
            yield functools.partial(gpu_case, section, m, False)
        for c in contracts(section):  # the contracts dispatch does not pick, on their own tactic
            for m in OTHER_AT:
                if c.dims["tokens"].contains(m) and contract_for(section, m) != c.name:
                    yield functools.partial(gpu_case, section, m, False, str(c.name))


def load_peer(w: Any, root: str | None) -> tuple[Any, str]:
    """SGLang 0.5.23's pipeline on these weights, or None with the reason (the record says which)."""
    try:
        from netra.bench.peers.sglang_moe import SglangMoePeer

        return SglangMoePeer.from_moe_weights(w, root), "sglang 0.5.23 (netra.bench.peers.sglang_moe)"
    except Exception as exc:  # the record names why the peer did not run; ours are still measured
        return None, f"not run: {type(exc).__name__}: {exc}"


def setup(opts: argparse.Namespace) -> dict[str, Any]:
    """The dispatch at experiment maturity, the layer and the peer (GPU); nothing for the smoke path."""
    from netra import dispatch

    if getattr(opts, "smoke", False):
        return {"layer": "small (16 experts top-4, hidden 256, width 128), CPU"}
    dispatch.reset(dispatch.Dispatcher(min_maturity="experiment"))
    _STATE["layer"] = w = moe_layer()
    _STATE["ties"] = with_router_ties(w)
    _STATE["peer"], note = load_peer(w, getattr(opts, "moe_sglang_root", None) or os.environ.get("NETRA_SGLANG_PEER"))
    print(f"moe peer: {note}", flush=True)
    return {"min_maturity": "experiment", "layer": "qwen36-35b-a3b layer 0 (seed 0)", "peer": note}


def targets(record: dict[str, Any]) -> dict[str, Any]:
    """Issue 18's thresholds on the record's rows: speedup = SGLang's median / ours; floor fraction ours."""
    def r(section: str, m: int, provider: str) -> dict[str, Any] | None:
        return next((x for x in record["rows"] if x["op"] == OPS[section] and x["shape"]["tokens"] == m
                     and x["provider"] == provider), None)

    out: dict[str, Any] = {}
    for name, (section, m, metric, need) in TARGETS.items():
        ours, peer = r(section, m, "netra"), r(section, m, "sglang")
        if metric == "speedup":
            value = round(peer["median_us"] / ours["median_us"], 3) if ours and peer else None
        else:
            value = ours.get("floor_fraction") if ours else None
        out[name] = {"need": need, "value": value, "pass": value is not None and value >= need}
    return out


# ---- the smoke path ----------------------------------------------------------------------------------------


def smoke_case(section: str, m: int) -> Case:
    dims = SMALL if section == "block" else {**SMALL, "hidden": HIDDEN}  # moe_routed_ref is written for 2048
    layer = small_layer(**dims)
    name = contract_for(section, m)
    run = engine_run(section) if section == "block" else routed_composed
    chk = functools.partial(check, section, m, name, layer, with_router_ties(layer), run, "cpu", kinds=KINDS)
    return Case(key=f"{section} tokens={m}", op=OPS[section], shape={"tokens": m, **dims}, dtype="fp8_e4m3_block128",
                check=chk, contract=name)


def smoke() -> Iterator[CaseBuilder]:
    for section, m in SMOKE:
        yield functools.partial(smoke_case, section, m)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--moe-tokens", default="", help=f"moe: timed token counts (default {TOKENS})")
    p.add_argument("--moe-sglang-root", default="",
                   help="moe, moe_prefill: the staged SGLang peer (default $NETRA_SGLANG_PEER, else .sglang_peer)")


CONTRACTS = ("moe_block_t1", "moe_block_stream_fold", "moe_block_stream", "moe_routed_t1", "moe_routed_stream")

SPEC = Spec(name="moe", family="moe", doc="MoE block and routed experts (1..128 tokens) against SGLang's",
            cases=cases, smoke=smoke, setup=setup, targets=targets, add_arguments=add_arguments, samples=40,
            contracts=CONTRACTS)
