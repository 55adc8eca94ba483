"""GDN decode (kernels/sm90/gdn/gdn_decode.py, contracts ``gdn_decode_*``) and the causal conv1d update before it
(kernels/sm90/conv/conv1d_update.py, ``conv1d_update_c8192_w4``): the decode step's GDN part, checked and timed
beside SGLang 0.5.23 and fla-core 0.6.0 (issue 19).

Shape: Qwen3.6-35B-A3B (16 key / 32 value heads, dk = dv = 128; conv 8192 channels, width 4). Batches 1, 8, 16, 32,
64, 128 (``--gdn-batches``), both state dtypes; each (state dtype, batch) is one case under the contract whose range
covers it.

Check (every case, the same functions on the GPU and on the smoke path): q/k/v strided views of one wider projection
(as the engine's), pad rows (slot 0) every 8th row, outputs poisoned (NaN) first; the output and the updated state
rows under the contract's ``numerics`` (`netra.validate.compare`), the conv state bitwise; pool rows outside the
batch bitwise unchanged; pad rows zero; eager == CUDA-graph replay bitwise (output and pool). Check-only cases:
five adversarial inputs per GDN contract (zero / huge q and k, extreme beta and decay, huge v and state), and the
ops through dispatch (minimum maturity ``experiment``) selecting each contract, bitwise its entry called directly.

Providers: ``netra`` (the contract's entry at its launch, graph replay, input sets rotated over distinct pool slots
past the L2); ``sglang`` (``fused_recurrent_gated_delta_rule_packed_decode`` on its own [slot, Hv, V, K] pool;
``causal_conv1d_update``), loaded unchanged from ``.sglang_peer`` (`netra.bench.peers.sglang_gdn`); ``fla-core``
(``fused_recurrent_gated_delta_rule``, gating in kernel, a per-batch initial state without a pool gather: favours
the peer) where the wheel imports. A peer that fails to load or to run is left out and named in the record.
``--gdn-sweep`` adds cases (no contract: they decide nothing) timing launch variants beside the contract's own,
each variant checked first.

Smoke (CPU, interpreter): the same checks at small heads (1 key / 2 value heads, dk = dv = 64, 256 channels), one
case per contract at a batch of its range, two adversarial cases; no graphs, no timing, no peers.

    python -m netra.bench.harness gdn_decode --out $OUT/gdn_decode     # carry .sglang_peer
"""

from __future__ import annotations

import argparse
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

from netra.bench.harness import Case, CaseBuilder, Spec
from netra.settings import REPO_ROOT

PEER_ROOT = REPO_ROOT / ".sglang_peer"
BITWISE = {"policy": "bitwise"}
CONV = "conv1d_update_c8192_w4"
BATCHES = (1, 8, 16, 32, 64, 128)
STATE_DTYPES = ("bfloat16", "float32")
ADVERSARIAL = ("zero_qk", "huge_qk", "beta_extremes", "decay_extremes", "huge_v_state")
ADV_BATCH = 8  # the adversarial cases' batch (the one in the contract's range nearest to it)
# (BV, warps, RELOAD): one-pass column tiles [dk, BV]; RELOAD re-reads the tile from L1 after the reductions
GDN_SWEEP = ((32, 4, 0), (32, 1, 0), (32, 1, 1), (16, 1, 0), (64, 4, 0), (64, 2, 0), (128, 8, 0))
CONV_SWEEP = ((256, 4, 0), (128, 4, 1), (512, 4, 1), (256, 2, 1), (128, 2, 1), (1024, 8, 1))  # (BC, warps, PDL)
HOSTILE_CHANNELS = 12  # conv_inputs' NaN/Inf/largest-finite values and NaN payloads sit in channels 0-11
GDN_ARGS = ("q", "k", "v", "a", "b", "a_log", "dt_bias")
PEERS: dict[str, Any] = {}  # setup's: name -> loaded peer functions


@dataclass(frozen=True)
class Dims:
    """GDN head geometry: q | k | v channels = 2·hk·dk + hv·dv (the conv's channels)."""

    hk: int
    hv: int
    dk: int
    dv: int
    width: int = 4

    @property
    def channels(self) -> int:
        return 2 * self.hk * self.dk + self.hv * self.dv


FULL = Dims(16, 32, 128, 128)
SMOKE = Dims(1, 2, 64, 64)  # two value heads on one key head; tiles of every contract's BV; 256 channels


# ---- shared with the other GDN specs ---------------------------------------------------------------------------

def tactic(doc: Mapping[str, Any]) -> Callable[..., Any]:
    """A contract's host entry (``entry(launch, **args)``), loaded from its source (compiled on a GPU, interpreted
    under the smoke path): the specs call it with the contract's launch or a sweep's."""
    from netra.ops._triton import load_source

    fn: Callable[..., Any] = getattr(load_source(doc["kernel"]["source"]), doc["kernel"]["symbol"])
    return fn


def same(x: Any, y: Any) -> bool:
    from netra.validate.compare import compare

    return bool(compare(BITWISE, x, y)["ok"])


def by_columns(numerics: Mapping[str, Any], got: Any, ref: Any, hostile: int) -> dict[str, Any]:
    """``got`` against ``ref`` [rows, C] under ``numerics``, each of the first ``hostile`` channels (the ones holding
    the inputs' largest finite values, NaN and Inf) judged alone and the others as one block: an elementwise
    policy scales its absolute floor by the tensor's largest finite value, so a 3e38 in one channel would otherwise
    hide every error in the rest."""
    from netra.validate.compare import compare

    out: dict[str, Any] = {"rest": compare(numerics, got[:, hostile:], ref[:, hostile:])}
    bad = [i for i in range(hostile) if not compare(numerics, got[:, i], ref[:, i])["ok"]]
    out["hostile_channels"] = {"channels": hostile, "failed": bad}
    out["ok"] = out["rest"]["ok"] and not bad
    return out


def replay_equal(call: Callable[[dict[str, Any]], Any], start: Mapping[str, Any], eager: Mapping[str, Any]) -> bool:
    """Eager == CUDA-graph replay: ``call(bufs)`` captured on fresh copies of ``start`` (the pools and the poisoned
    outputs it writes), the copies restored to ``start``, replayed; each of ``eager``'s tensors (what the eager call
    left) bitwise the replay's."""
    import torch

    bufs = {k: v.clone() for k, v in start.items()}
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(bufs)
    for k, v in start.items():
        bufs[k].copy_(v)
    graph.replay()
    torch.cuda.synchronize()
    ok = all(same(bufs[k], v) for k, v in eager.items())
    del graph
    return ok


def in_range(doc: Mapping[str, Any], **dims: int) -> bool:
    rng = doc["match"]["dims"]
    return all(int(rng[k].get("min", 1)) <= v <= int(rng[k].get("max", 1 << 30)) for k, v in dims.items())


def clamp(doc: Mapping[str, Any], dim: str, want: int) -> int:
    """The value of ``dim`` in the contract's range nearest ``want``."""
    rng = doc["match"]["dims"][dim]
    return max(int(rng.get("min", 1)), min(want, int(rng.get("max", 1 << 30))))


def state_dtype(doc: Mapping[str, Any]) -> Any:
    import torch

    return getattr(torch, doc["match"]["dtypes"]["state"][0])


def n_sets(bytes_per_set: int, target: int = 192 << 20, most: int = 1024) -> int:
    """Input sets to rotate over so that together they exceed the L2 (at least two)."""
    return max(2, min(most, -(-target // max(1, bytes_per_set))))


def warm(providers: dict[str, Callable[[int], Any]], dropped: dict[str, str],
         device: str = "cuda") -> dict[str, Callable[[int], Any]]:
    """First use (compiles, loads) of each provider but ours, one at a time: a peer that fails is left out and named
    in ``dropped`` (the case's check records it) instead of failing the case."""
    import torch

    out: dict[str, Callable[[int], Any]] = {}
    for name, fn in providers.items():
        if name == "netra":
            out[name] = fn
            continue
        try:
            fn(0)
            if device == "cuda":
                torch.cuda.synchronize()
            out[name] = fn
        except Exception as exc:  # a peer's failure is recorded, never hidden, and never fails our case
            dropped[name] = f"{type(exc).__name__}: {exc}"[:300]
    return out


def decode_docs() -> dict[str, dict[str, Any]]:
    from netra.catalog import contract_docs

    return contract_docs("sm90", "gdn", "gdn_decode")


def covering(docs: Mapping[str, dict[str, Any]], sdt: Any, **dims: int) -> dict[str, Any] | None:
    """The contract of ``docs`` for state dtype ``sdt`` whose range covers ``dims`` (the one dispatch selects)."""
    for doc in docs.values():
        if state_dtype(doc) == sdt and in_range(doc, **dims):
            return doc
    return None


# ---- inputs ----------------------------------------------------------------------------------------------------

def gdn_inputs(d: Dims, bsz: int, sdt: Any, n_slots: int, seed: int, device: str) -> dict[str, Any]:
    """q, k, v as strided views of one qkvz projection row (z beside them), a | b views of one, a pool."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    kd, vd = d.hk * d.dk, d.hv * d.dv
    qkvz = torch.randn(bsz, 2 * kd + 2 * vd, device=device, generator=g).bfloat16()
    ba = torch.randn(bsz, 2 * d.hv, device=device, generator=g).bfloat16()
    return {"qkvz": qkvz, "q": qkvz[:, :kd].view(bsz, d.hk, d.dk), "k": qkvz[:, kd:2 * kd].view(bsz, d.hk, d.dk),
            "v": qkvz[:, 2 * kd:2 * kd + vd].view(bsz, d.hv, d.dv), "b": ba[:, :d.hv], "a": ba[:, d.hv:],
            "a_log": torch.log(torch.rand(d.hv, device=device, generator=g) * 15 + 1),
            "dt_bias": (torch.randn(d.hv, device=device, generator=g) * 0.5).bfloat16(),
            "pool": (torch.randn(n_slots, d.hv, d.dk, d.dv, device=device, generator=g) * 0.3).to(sdt)}


def adversarial(case: str, t: dict[str, Any]) -> None:
    import torch

    q, k = t["q"], t["k"]
    if case == "zero_qk":
        q[0].zero_()
        k[1].zero_()
    elif case == "huge_qk":
        q[0].fill_(3e38)
        k[0].fill_(-2e19)
        q[1].mul_(1e15)
        k[1].mul_(1e15)
    elif case == "beta_extremes":
        t["b"][0].fill_(-60.0)
        t["b"][1].fill_(60.0)
    elif case == "decay_extremes":
        t["a"][0].fill_(80.0)
        t["a"][1].fill_(-60.0)
        t["a_log"].fill_(float(torch.log(torch.tensor(16.0))))
    elif case == "huge_v_state":
        t["v"].mul_(1e4)
        t["pool"].mul_(1e3)
    else:
        raise ValueError(f"unknown adversarial case {case!r}")


def slots_for(bsz: int, n_slots: int, device: str, seed: int, pad_every: int = 8) -> Any:
    """``bsz`` distinct live slots in 1..n_slots-1, shuffled; every ``pad_every``-th row a pad row (slot 0)."""
    import torch

    from netra.ops import gdn

    s = torch.arange(1, 1 + bsz, dtype=torch.int64)[torch.randperm(bsz, generator=torch.Generator().manual_seed(seed))]
    if pad_every and bsz >= pad_every:
        s[pad_every - 1::pad_every] = gdn.PAD_SLOT
    assert int(s.max()) < n_slots
    return s.to(device)


def conv_inputs(d: Dims, bsz: int, n_slots: int, seed: int, device: str) -> tuple[Any, Any, Any]:
    """x [B, C] a strided view of the in-projection (z beside it), with NaN, Inf, the largest finite values and NaNs
    of non-canonical payloads in live rows; weight; a pool."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    c = d.channels
    xz = torch.randn(bsz, c + d.hv * d.dv, device=device, generator=g).bfloat16()
    w = (torch.randn(c, d.width, device=device, generator=g) * 0.5).bfloat16()
    pool = torch.randn(n_slots, c, d.width - 1, device=device, generator=g).bfloat16()
    if bsz >= 2:
        xz[0, :4] = torch.tensor([float("nan"), float("inf"), 3e38, -3e38]).bfloat16()
        xz[1, 8:12] = torch.tensor([0x7FA1, -0x003F, 0x7F81, -0x0001], dtype=torch.int16).view(torch.bfloat16)
    return xz[:, :c], w, pool


# ---- checks ----------------------------------------------------------------------------------------------------

def check_gdn(doc: Mapping[str, Any], launch: Mapping[str, Any], d: Dims, bsz: int, device: str,
              adv: str | None = None) -> dict[str, Any]:
    """The GDN decode tactic at ``launch`` against `gdn_decode_fused_ref` under the contract's numerics."""
    import torch

    from netra.ops import gdn
    from netra.validate.compare import compare

    label = f"{doc['name']} {adv or 'random'} b{bsz} {launch}"
    n_slots = bsz + 3
    t = gdn_inputs(d, bsz, state_dtype(doc), n_slots, zlib.crc32(label.encode()), device)
    if adv:
        adversarial(adv, t)
    slots = slots_for(bsz, n_slots, device, bsz)
    args = {k: t[k] for k in GDN_ARGS}
    pool = t["pool"]
    fn = tactic(doc)
    mine, ref = pool.clone(), pool.clone()
    out = torch.full((bsz, d.hv, d.dv), float("nan"), dtype=torch.bfloat16, device=device)
    fn(dict(launch), **args, state_pool=mine, slots=slots, out=out)
    o_ref = gdn.gdn_decode_fused_ref(**args, state_pool=ref, slots=slots)
    live = sorted({int(s) for s in slots.tolist()} - {gdn.PAD_SLOT})
    other = [i for i in range(n_slots) if i not in live]
    pad = slots == gdn.PAD_SLOT
    res: dict[str, Any] = {"o": compare(doc["numerics"], out, o_ref),
                           "state": compare(doc["numerics"], mine[live], ref[live]),
                           "untouched": compare(BITWISE, mine[other], pool[other]),
                           "pad_rows_zero": bool((out[pad] == 0).all())}
    ok = res["o"]["ok"] and res["state"]["ok"] and res["untouched"]["ok"] and res["pad_rows_zero"]
    res["eager_equals_replay"] = None
    if device == "cuda":
        res["eager_equals_replay"] = replay_equal(
            lambda b: fn(dict(launch), **args, state_pool=b["pool"], slots=slots, out=b["out"]),
            {"pool": pool, "out": torch.full_like(out, float("nan"))}, {"pool": mine, "out": out})
        ok = ok and res["eager_equals_replay"]
    return {**res, "ok": ok}


def check_conv(doc: Mapping[str, Any], launch: Mapping[str, Any], d: Dims, bsz: int, device: str) -> dict[str, Any]:
    """The conv update tactic at ``launch``: output under the contract's numerics, the pool bitwise
    `causal_conv1d_update_ref`'s (where it differs: the first elements, as raw bits)."""
    import torch

    from netra.ops import conv
    from netra.validate.compare import compare

    n_slots = bsz + 3
    x, w, pool = conv_inputs(d, bsz, n_slots, bsz, device)
    slots = slots_for(bsz, n_slots, device, bsz + 1)
    fn = tactic(doc)
    mine, ref = pool.clone(), pool.clone()
    out = torch.full((bsz, d.channels), float("nan"), dtype=x.dtype, device=device)
    fn(dict(launch), x=x, weight=w, state_pool=mine, slots=slots, out=out)
    y_ref = conv.causal_conv1d_update_ref(x, w, ref, slots)
    pad = slots == conv.PAD_SLOT
    res: dict[str, Any] = {"y": by_columns(doc["numerics"], out, y_ref, HOSTILE_CHANNELS),
                           "state": compare(BITWISE, mine, ref),
                           "pad_rows_zero": bool((out[pad] == 0).all())}
    if not res["state"]["ok"]:  # where: (pool row, channel, tap, ours, reference) as raw bits
        mb, rb = mine.view(torch.int16), ref.view(torch.int16)
        bad = (mb != rb).nonzero()
        res["state_mismatch"] = [[*map(int, e), int(mb[tuple(e)]), int(rb[tuple(e)])] for e in bad[:8].tolist()]
    ok = res["y"]["ok"] and res["state"]["ok"] and res["pad_rows_zero"]
    res["eager_equals_replay"] = None
    if device == "cuda":
        res["eager_equals_replay"] = replay_equal(
            lambda b: fn(dict(launch), x=x, weight=w, state_pool=b["pool"], slots=slots, out=b["out"]),
            {"pool": pool, "out": torch.full_like(out, float("nan"))}, {"pool": mine, "out": out})
        ok = ok and res["eager_equals_replay"]
    return {**res, "ok": ok}


def check_dispatch(doc: Mapping[str, Any], bsz: int) -> dict[str, Any]:
    """The op through dispatch (minimum maturity ``experiment``) at a batch the contract covers: it selects the
    contract, and gives bitwise what the contract's entry gives called directly (GPU)."""
    from netra import dispatch
    from netra.ops import _common, conv, gdn

    dispatch.reset(dispatch.Dispatcher(min_maturity="experiment"))
    _common.reset_decisions()
    try:
        fn = tactic(doc)
        if doc["family"] == "gdn":
            t = gdn_inputs(FULL, bsz, state_dtype(doc), bsz + 3, 7, "cuda")
            args = {k: t[k] for k in GDN_ARGS}
            slots = slots_for(bsz, bsz + 3, "cuda", 7)
            p1, p2 = t["pool"].clone(), t["pool"].clone()
            o1 = gdn.gdn_decode_fused(**args, state_pool=p1, slots=slots)
            o2 = fn(doc["launch"], **args, state_pool=p2, slots=slots)
            chosen = _common.decisions().get("gdn_decode_fused", [])
        else:
            x, w, pool = conv_inputs(FULL, bsz, bsz + 3, 7, "cuda")
            slots = slots_for(bsz, bsz + 3, "cuda", 7)
            p1, p2 = pool.clone(), pool.clone()
            o1 = conv.causal_conv1d_update(x, w, p1, slots)
            o2 = fn(doc["launch"], x=x, weight=w, state_pool=p2, slots=slots)
            chosen = _common.decisions().get("causal_conv1d_update", [])
        res = {"selected": chosen, "chose_it": doc["name"] in chosen, "output_bitwise": same(o1, o2),
               "pool_bitwise": same(p1, p2)}
    finally:
        dispatch.reset()
        _common.reset_decisions()
    return {**res, "ok": res["chose_it"] and res["output_bitwise"] and res["pool_bitwise"]}


# ---- timing (GPU) ----------------------------------------------------------------------------------------------

def gdn_floor_bytes(d: Dims, bsz: int, state_bytes: int) -> int:
    """State read and written, q/k/v read, o written, a/b read."""
    return (2 * bsz * d.hv * d.dk * d.dv * state_bytes + bsz * d.channels * 2 + bsz * d.hv * d.dv * 2
            + bsz * d.hv * 4)


def conv_floor_bytes(d: Dims, bsz: int) -> int:
    """x read, state read and written, y written, the weights read."""
    c = d.channels
    return bsz * c * 2 + 2 * bsz * c * (d.width - 1) * 2 + bsz * c * 2 + c * d.width * 2


def gdn_launches(doc: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The sweep's launches other than the contract's own, by row label."""
    m, launch = doc["launch"]["meta"], doc["launch"]
    base = (m["BV"], launch["block"] // 32, int(m.get("RELOAD", 0)))
    return {f"sweep:BV{bv}w{warps}r{reload}": {**launch, "block": 32 * warps, "meta": {**m, "BV": bv, "RELOAD": reload}}
            for bv, warps, reload in GDN_SWEEP if (bv, warps, reload) != base}


def conv_launches(doc: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    m, launch = doc["launch"]["meta"], doc["launch"]
    base = (m["BC"], launch["block"] // 32, int(m.get("PDL", 0)))
    return {f"sweep:BC{bc}w{warps}pdl{pdl}": {**launch, "block": 32 * warps, "meta": {**m, "BC": bc, "PDL": pdl}}
            for bc, warps, pdl in CONV_SWEEP if (bc, warps, pdl) != base}


def gdn_case(doc: dict[str, Any], bsz: int, sweep: bool, d: Dims = FULL, device: str = "cuda") -> Case:
    """One (state dtype, batch) on the GPU: the contract's entry beside the peers (or, ``sweep``, beside its launch
    variants, no contract), over input sets on distinct pool slots. (``d``, ``device``: the same code at other
    heads or on the CPU, where the tests call it.)"""
    import torch

    fn, sdt = tactic(doc), state_dtype(doc)
    sbytes = torch.empty((), dtype=sdt).element_size()
    n = n_sets(bsz * d.hv * d.dk * d.dv * sbytes) if device == "cuda" else 2
    t = gdn_inputs(d, bsz, sdt, 1, bsz, device)
    pool = torch.empty(n * bsz + 1, d.hv, d.dk, d.dv, dtype=sdt, device=device).normal_().mul_(0.3)
    slots = [torch.arange(1 + i * bsz, 1 + (i + 1) * bsz, dtype=torch.int64, device=device) for i in range(n)]
    args = {k: t[k] for k in GDN_ARGS}
    hold: list[Any] = [pool, t, slots]

    def ours(la: Mapping[str, Any]) -> Callable[[int], Any]:
        return lambda i: fn(dict(la), **args, state_pool=pool, slots=slots[i])

    providers: dict[str, Callable[[int], Any]] = {"netra": ours(doc["launch"])}
    launches = gdn_launches(doc) if sweep else {}
    for label, la in launches.items():
        providers[label] = ours(la)
    if "sglang" in PEERS and not sweep:
        spool = torch.empty(n * bsz + 1, d.hv, d.dv, d.dk, dtype=sdt, device=device).normal_().mul_(0.3)
        sslots = [s.to(torch.int32) for s in slots]
        mixed = t["qkvz"][:, :d.channels]
        out = torch.empty(bsz, 1, d.hv, d.dv, dtype=torch.bfloat16, device=device)
        dec = PEERS["sglang"]["decode"]
        providers["sglang"] = lambda i: dec(
            mixed_qkv=mixed, a=t["a"], b=t["b"], A_log=t["a_log"], dt_bias=t["dt_bias"], scale=d.dk ** -0.5,
            initial_state=spool, out=out, ssm_state_indices=sslots[i], use_qk_l2norm_in_kernel=True)
        hold += [spool, sslots, out]
    if "fla" in PEERS and not sweep:
        fq, fk, fv = (t[x].contiguous().unsqueeze(1) for x in ("q", "k", "v"))
        fa, fb = t["a"].contiguous().unsqueeze(1), t["b"].contiguous().unsqueeze(1)
        h0 = [torch.empty(bsz, d.hv, d.dk, d.dv, dtype=sdt, device=device).normal_().mul_(0.3) for _ in range(n)]
        frd = PEERS["fla"]
        providers["fla-core"] = lambda i: frd(
            fq, fk, fv, g=fa, beta=fb, scale=d.dk ** -0.5, initial_state=h0[i], output_final_state=True,
            use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=t["a_log"], dt_bias=t["dt_bias"],
            use_beta_sigmoid_in_kernel=True)
        hold += [h0, fq, fk, fv, fa, fb]
    dropped: dict[str, str] = {}
    providers = warm(providers, dropped, device)

    def check() -> dict[str, Any]:
        res = check_gdn(doc, doc["launch"], d, bsz, device)
        if sweep:  # every timed variant checked too: a faster launch is only worth adopting if it is right
            res["variants"] = {label: check_gdn(doc, la, d, bsz, device) for label, la in launches.items()}
            res["ok"] = res["ok"] and all(v["ok"] for v in res["variants"].values())
        return {**res, **({"providers_dropped": dropped} if dropped else {})}

    dtype = f"state {str(sdt).removeprefix('torch.')}"
    return Case(key=f"gdn {dtype} b{bsz}" + (" sweep" if sweep else ""), op="gdn_decode",
                shape={"batch": bsz, "v_heads": d.hv, "k_dim": d.dk, "v_dim": d.dv}, dtype=dtype,
                providers=providers, check=check, contract=None if sweep else doc["name"], n_inputs=n,
                floor_bytes=gdn_floor_bytes(d, bsz, sbytes), hold=hold)


def conv_case(doc: dict[str, Any], bsz: int, sweep: bool, d: Dims = FULL, device: str = "cuda") -> Case:
    import torch

    fn = tactic(doc)
    c = d.channels
    n = n_sets(bsz * c * (d.width - 1) * 2 * 2) if device == "cuda" else 2
    x = torch.randn(bsz, c + d.hv * d.dv, device=device).bfloat16()[:, :c]  # the in-projection's strided view
    w = (torch.randn(c, d.width, device=device) * 0.5).bfloat16()
    pool = torch.randn(n * bsz + 1, c, d.width - 1, device=device).bfloat16()
    slots = [torch.arange(1 + i * bsz, 1 + (i + 1) * bsz, dtype=torch.int64, device=device) for i in range(n)]
    hold: list[Any] = [x, w, pool, slots]

    def ours(la: Mapping[str, Any]) -> Callable[[int], Any]:
        return lambda i: fn(dict(la), x=x, weight=w, state_pool=pool, slots=slots[i])

    providers: dict[str, Callable[[int], Any]] = {"netra": ours(doc["launch"])}
    launches = conv_launches(doc) if sweep else {}
    for label, la in launches.items():
        providers[label] = ours(la)
    if "sglang" in PEERS and not sweep:
        cu = PEERS["sglang"]["conv"]
        sslots = [s.to(torch.int32) for s in slots]
        providers["sglang"] = lambda i: cu(x, pool, w, None, "silu", conv_state_indices=sslots[i])
        hold.append(sslots)
    dropped: dict[str, str] = {}
    providers = warm(providers, dropped, device)

    def check() -> dict[str, Any]:
        res = check_conv(doc, doc["launch"], d, bsz, device)
        if sweep:
            res["variants"] = {label: check_conv(doc, la, d, bsz, device) for label, la in launches.items()}
            res["ok"] = res["ok"] and all(v["ok"] for v in res["variants"].values())
        return {**res, **({"providers_dropped": dropped} if dropped else {})}

    return Case(key=f"conv b{bsz}" + (" sweep" if sweep else ""), op="causal_conv1d_update",
                shape={"batch": bsz, "channels": c, "width": d.width}, dtype="bfloat16", providers=providers,
                check=check, contract=None if sweep else doc["name"], n_inputs=n,
                floor_bytes=conv_floor_bytes(d, bsz), hold=hold)


def check_case(key: str, op: str, doc: Mapping[str, Any], check: Callable[[], Mapping[str, Any]],
               **shape: Any) -> Case:
    """A check-only case of contract ``doc`` (nothing timed)."""
    return Case(key=key, op=op, shape=shape, dtype=str(doc["match"]["dtypes"]["state"][0]), check=check,
                contract=doc["name"])


def cases(opts: argparse.Namespace) -> Iterator[CaseBuilder]:
    import torch

    from netra.catalog import contract_doc

    batches = [int(b) for b in str(getattr(opts, "gdn_batches", "") or ",".join(map(str, BATCHES))).split(",")]
    sweep = bool(getattr(opts, "gdn_sweep", False))
    docs, conv_doc = decode_docs(), contract_doc(CONV)
    # the check-only cases first (fast): a run cut by --deadline still has every contract's whole oracle
    for name, doc in docs.items():
        b = clamp(doc, "batch", ADV_BATCH)
        for adv in ADVERSARIAL:
            yield partial(check_case, f"{name} {adv} b{b}", "gdn_decode", doc,
                          partial(check_gdn, doc, doc["launch"], FULL, b, "cuda", adv), batch=b)
    for doc in [*docs.values(), conv_doc]:
        b = clamp(doc, "batch", 8)
        yield partial(check_case, f"{doc['name']} dispatch b{b}", "dispatch", doc, partial(check_dispatch, doc, b),
                      batch=b)
    for timed_sweep in (False, True) if sweep else (False,):
        for sname in STATE_DTYPES:
            for b in batches:
                hit = covering(docs, getattr(torch, sname), batch=b)
                if hit is not None:
                    yield partial(gdn_case, hit, b, timed_sweep)
        for b in batches:
            if in_range(conv_doc, batch=b):
                yield partial(conv_case, conv_doc, b, timed_sweep)


def smoke() -> Iterator[CaseBuilder]:
    from netra.catalog import contract_doc

    docs = decode_docs()
    for name, doc in docs.items():
        b = clamp(doc, "batch", 9)  # a pad row at row 8 where the range allows
        yield partial(check_case, f"{name} random b{b}", "gdn_decode", doc,
                      partial(check_gdn, doc, doc["launch"], SMOKE, b, "cpu"), batch=b)
    first = next(iter(docs.values()))
    for adv in ADVERSARIAL[:2]:
        yield partial(check_case, f"{first['name']} {adv} b2", "gdn_decode", first,
                      partial(check_gdn, first, first["launch"], SMOKE, 2, "cpu", adv), batch=2)
    conv_doc = contract_doc(CONV)
    yield partial(check_case, f"{CONV} b9", "causal_conv1d_update", conv_doc,
                  partial(check_conv, conv_doc, conv_doc["launch"], SMOKE, 9, "cpu"), batch=9)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gdn-batches", default="", help="gdn_decode: comma-separated batches (default 1,8,16,32,64,128)")
    p.add_argument("--gdn-sweep", action="store_true", help="gdn_decode: also time (and check) launch variants")


def load_peers() -> dict[str, str]:
    """SGLang's decode and conv kernels, fla-core's recurrent kernel, into `PEERS`; what was loaded, or why not."""
    PEERS.clear()
    state: dict[str, str] = {}
    try:
        from netra.bench.peers import sglang_gdn

        PEERS["sglang"] = sglang_gdn.load(PEER_ROOT)
        state["sglang"] = ("0.5.23 wheel files: fused_recurrent_gated_delta_rule_packed_decode, "
                           "causal_conv1d_update")
    except Exception as exc:
        state["sglang"] = f"not loaded: {type(exc).__name__}: {exc}"[:300]
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

        PEERS["fla"] = fused_recurrent_gated_delta_rule
        state["fla-core"] = ("fused_recurrent_gated_delta_rule (gate + beta sigmoid in kernel; per-batch initial "
                             "state, no pool gather, FP32 final state)")
    except Exception as exc:
        state["fla-core"] = f"not loaded: {type(exc).__name__}: {exc}"[:300]
    return state


def setup(opts: argparse.Namespace) -> dict[str, Any]:
    if getattr(opts, "smoke", False):
        return {"peers": "none (smoke path)", "dims": asdict(SMOKE)}
    return {"peers": load_peers(), "dims": asdict(FULL)}


SPEC = Spec(name="gdn_decode", family="gdn", doc="GDN decode and the conv1d update before it, beside SGLang/fla-core",
            cases=cases, smoke=smoke,
            contracts=("gdn_decode_f32_small_hv32", "gdn_decode_f32_hv32", "gdn_decode_bf16_small_hv32",
                       "gdn_decode_bf16_hv32", CONV),
            setup=setup, add_arguments=add_arguments)
