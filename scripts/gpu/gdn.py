"""GDN decode + causal conv1d update on the H200: oracle checks and side-by-side timing (issue 19).

Run from the repo root with the carried peers (``.sglang_peer/`` from
``make sglang-peer``; the fla-core 0.6.0 + einops wheels carried in ``.whl/`` and installed on the
PYTHONPATH by the device session; without them the fla-core rows are left out):

    timeout 240 python scripts/gpu/gdn.py --out $OUT/gdn

1. Checks, per contract of kernels/sm90/gdn and kernels/sm90/conv, at every timed batch plus
   adversarial inputs: outputs poisoned (NaN) before each run, the engine's strided input views,
   pad rows on slot 0, compared with the contract's oracle under its declared numerics (read from
   the contract file); rows of the pool outside ``slots`` bitwise unchanged; eager == CUDA-graph
   replay bitwise (output and pool).
2. Timing with the one protocol (netra/bench/timing.py): graph replay, inputs rotated over distinct
   pool slots (> L2 together), providers interleaved, the copy-rate floor from the same run.
   Providers: netra (the contract's launch), SGLang 0.5.23 (packed decode with its own [slot, Hv, V, K]
   pool; causal_conv1d_update), fla-core 0.6.0 ``fused_recurrent_gated_delta_rule`` (gating in
   kernel; a per-batch initial state, no pool gather, final state always FP32: favours the peer),
   and launch variants of ours (``sweep:``) to choose the contract's meta.
3. JSON records (RESULTS.md) in ``--out``, one per family (``gdn_h200.json``, ``conv_h200.json``), each
   with its promotion gates per contract (oracle + at least as fast as every measured peer at every
   batch the contract covers) and the sha256 of the sources measured; a short table printed last.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
import traceback
import zlib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from netra.bench.timing import Provider, copy_bandwidth, interleave, row  # noqa: E402
from netra.catalog import contract_docs  # noqa: E402
from netra.ops import _triton, conv, gdn  # noqa: E402

HK, HV, DK, DV, C, W = 16, 32, 128, 128, 8192, 4
ZW = HV * DV  # the z part of the qkvz projection: q/k/v are strided views, as in the engine
# (BV, warps, RELOAD): one-pass column tiles [dk, BV]; RELOAD re-reads the tile from L1 after the reductions.
# (The two-pass row-block kernel, meta BK > 0, was swept on 2026-12-02 and lost everywhere: results/sm90/gdn_h200.json.)
GDN_SWEEP = [(32, 4, 0), (32, 1, 0), (32, 1, 1), (16, 1, 0), (64, 4, 0), (64, 2, 0), (128, 8, 0)]
SWEEP_CHECK_B = 24  # every sweep variant is also checked against the oracle (pad rows every 8th) at this batch
CONV_SWEEP = [(256, 4, 0), (128, 4, 1), (512, 4, 1), (256, 2, 1), (128, 2, 1), (1024, 8, 1)]  # (BC, warps, PDL)
ADVERSARIAL = ["zero_qk", "huge_qk", "beta_extremes", "decay_extremes", "huge_v_state"]
LOG: list[str] = []
ADV_B = [8]  # the batch of the adversarial cases (pad rows every 8th)
DEV = ["cuda"]  # "cpu" under --cpu-smoke: the checks' logic through Triton's interpreter, no graphs, no timing


def sync() -> None:
    if DEV[0] == "cuda":
        torch.cuda.synchronize()


def log(msg: str) -> None:
    print(msg, flush=True)
    LOG.append(msg)


def attempt(what: str, failures: dict[str, str], fn: Any, *args: Any, **kw: Any) -> Any:
    """Run one step; record a failure (with its traceback tail) and go on."""
    try:
        return fn(*args, **kw)
    except Exception as exc:  # a bug in one step must not waste the device call
        failures[what] = f"{type(exc).__name__}: {exc}"
        log(f"FAILED {what}: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}")
        return None


# ---- inputs ----------------------------------------------------------------------------------------

def gdn_inputs(bsz: int, sdt: torch.dtype, n_slots: int, seed: int) -> dict[str, Any]:
    g = torch.Generator(device=DEV[0]).manual_seed(seed)
    qkvz = torch.randn(bsz, 2 * HK * DK + HV * DV + ZW, device=DEV[0], generator=g).bfloat16()
    ba = torch.randn(bsz, 2 * HV, device=DEV[0], generator=g).bfloat16()
    return {"qkvz": qkvz, "q": qkvz[:, :HK * DK].view(bsz, HK, DK), "k": qkvz[:, HK * DK:2 * HK * DK].view(bsz, HK, DK),
            "v": qkvz[:, 2 * HK * DK:2 * HK * DK + HV * DV].view(bsz, HV, DV), "b": ba[:, :HV], "a": ba[:, HV:],
            "a_log": torch.log(torch.rand(HV, device=DEV[0], generator=g) * 15 + 1),
            "dt_bias": (torch.randn(HV, device=DEV[0], generator=g) * 0.5).bfloat16(),
            "pool": (torch.randn(n_slots, HV, DK, DV, device=DEV[0], generator=g) * 0.3).to(sdt)}


def adversarial(case: str, t: dict[str, Any]) -> None:
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


def slots_for(bsz: int, n_slots: int, pad_every: int = 0, offset: int = 1) -> torch.Tensor:
    s = torch.arange(offset, offset + bsz, dtype=torch.int64)
    s = s[torch.randperm(bsz)]
    if pad_every:
        s[pad_every - 1::pad_every] = gdn.PAD_SLOT
    assert int(s.max()) < n_slots
    return s.to(DEV[0])


# ---- checks ----------------------------------------------------------------------------------------

def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


def check_gdn_case(entry: Any, doc: dict[str, Any], t: dict[str, Any], slots: torch.Tensor) -> dict[str, Any]:
    rtol, atol = doc["numerics"]["rtol"], doc["numerics"]["atol"]
    args = {k: t[k] for k in ("q", "k", "v", "a", "b", "a_log", "dt_bias")}
    pool = t["pool"]
    mine, ref = pool.clone(), pool.clone()
    out = torch.full((slots.numel(), HV, DV), float("nan"), dtype=torch.bfloat16, device=DEV[0])
    entry(doc["launch"], **args, state_pool=mine, slots=slots, out=out)
    o_ref = gdn.gdn_decode_fused_ref(**args, state_pool=ref, slots=slots)
    sync()
    live = sorted({int(s) for s in slots.tolist() if int(s) != gdn.PAD_SLOT})
    other = [i for i in range(pool.shape[0]) if i not in live]
    rep_o = _triton.tolerance_report(out, o_ref, rtol, atol)
    rep_s = _triton.tolerance_report(mine[live], ref[live], rtol, atol)
    pad = slots == gdn.PAD_SLOT
    res = {"o": rep_o, "state": rep_s, "untouched_bitwise": bool(torch.equal(_bits(mine[other]), _bits(pool[other]))),
           "pad_rows_zero": bool((out[pad] == 0).all())}
    if DEV[0] == "cpu":
        res["eager_equals_replay"] = None
        res["ok"] = rep_o["ok"] and rep_s["ok"] and res["untouched_bitwise"] and res["pad_rows_zero"]
        return res
    # eager == replay: the same call captured, replayed on a fresh copy of the pool
    g_pool = pool.clone()
    g_out = torch.full_like(out, float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        entry(doc["launch"], **args, state_pool=g_pool, slots=slots, out=g_out)
    g_pool.copy_(pool)
    g_out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    res["eager_equals_replay"] = bool(torch.equal(_bits(g_out), _bits(out)) and torch.equal(_bits(g_pool), _bits(mine)))
    res["ok"] = rep_o["ok"] and rep_s["ok"] and res["untouched_bitwise"] and res["pad_rows_zero"] \
        and res["eager_equals_replay"]
    return res


def check_conv_case(entry: Any, doc: dict[str, Any], x: torch.Tensor, w: torch.Tensor, pool: torch.Tensor,
                    slots: torch.Tensor) -> dict[str, Any]:
    rtol, atol = doc["numerics"]["rtol"], doc["numerics"]["atol"]
    mine, ref = pool.clone(), pool.clone()
    out = torch.full((x.shape[0], C), float("nan"), dtype=x.dtype, device=DEV[0])
    entry(doc["launch"], x=x, weight=w, state_pool=mine, slots=slots, out=out)
    y_ref = conv.causal_conv1d_update_ref(x, w, ref, slots)
    sync()
    pad = slots == conv.PAD_SLOT
    res: dict[str, Any] = {"y": _triton.tolerance_report(out, y_ref, rtol, atol),
                           "state_bitwise": bool(torch.equal(_bits(mine), _bits(ref))),
                           "pad_rows_zero": bool((out[pad] == 0).all())}
    if not res["state_bitwise"]:  # where and how: (pool row, channel, tap, ours, reference) as raw bits
        bad = (_bits(mine) != _bits(ref)).nonzero()
        res["state_mismatch"] = {"elements": int(bad.shape[0]), "rows": sorted({int(r) for r in bad[:, 0].tolist()}),
                                 "first": [[*map(int, e), int(_bits(mine)[tuple(e)]), int(_bits(ref)[tuple(e)])]
                                           for e in bad[:8].tolist()]}
    if DEV[0] == "cpu":
        res["eager_equals_replay"] = None
        res["ok"] = res["y"]["ok"] and res["state_bitwise"] and res["pad_rows_zero"]
        return res
    g_pool, g_out = pool.clone(), torch.full_like(out, float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        entry(doc["launch"], x=x, weight=w, state_pool=g_pool, slots=slots, out=g_out)
    g_pool.copy_(pool)
    graph.replay()
    torch.cuda.synchronize()
    res["eager_equals_replay"] = bool(torch.equal(_bits(g_out), _bits(out)) and torch.equal(_bits(g_pool), _bits(mine)))
    res["ok"] = res["y"]["ok"] and res["state_bitwise"] and res["pad_rows_zero"] and res["eager_equals_replay"]
    return res


def in_range(doc: dict[str, Any], b: int) -> bool:
    rng = doc["match"]["dims"]["batch"]
    return int(rng.get("min", 1)) <= b <= int(rng.get("max", 1 << 30))


def gdn_sweep(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The sweep's launches other than the contract's own: (row label, launch)."""
    m = doc["launch"]["meta"]
    base = (m["BV"], doc["launch"]["block"] // 32, int(m.get("RELOAD", 0)))
    return [(f"sweep:BV{bv}w{warps}r{reload}",
             {**doc["launch"], "block": 32 * warps, "meta": {**m, "BV": bv, "RELOAD": reload}})
            for bv, warps, reload in GDN_SWEEP if (bv, warps, reload) != base]


def gdn_case(entry: Any, doc: dict[str, Any], b: int, adv: str | None, label: str) -> dict[str, Any]:
    t = gdn_inputs(b, getattr(torch, doc["match"]["dtypes"]["state"][0]), b + 3, seed=zlib.crc32(label.encode()))
    if adv:
        adversarial(adv, t)
    return check_gdn_case(entry, doc, t, slots_for(b, b + 3, pad_every=8 if b >= 8 else 0))


def conv_case(entry: Any, doc: dict[str, Any], b: int) -> dict[str, Any]:
    g = torch.Generator(device=DEV[0]).manual_seed(b)
    xz = torch.randn(b, C + ZW, device=DEV[0], generator=g).bfloat16()
    w = (torch.randn(C, W, device=DEV[0], generator=g) * 0.5).bfloat16()
    pool = torch.randn(b + 3, C, W - 1, device=DEV[0], generator=g).bfloat16()
    if b >= 2:  # NaN, Inf and the largest finite values in a live row; NaNs with non-canonical payloads
        xz[0, :4] = torch.tensor([float("nan"), float("inf"), 3e38, -3e38]).bfloat16()
        xz[1, 8:12] = torch.tensor([0x7FA1, -0x003F, 0x7F81, -0x0001], dtype=torch.int16).view(torch.bfloat16)
    return check_conv_case(entry, doc, xz[:, :C], w, pool, slots_for(b, b + 3, pad_every=8 if b >= 8 else 0))


def dispatch_case(entries: dict[str, Any], docs: dict[str, Any]) -> dict[str, Any]:
    """The ops through dispatch (minimum maturity ``experiment``): each selects its contract, and the
    bound launcher gives bitwise what the contract's entry gives called directly."""
    from netra import dispatch
    from netra.ops import _common

    dispatch.reset(dispatch.Dispatcher(min_maturity="experiment"))
    _common.reset_decisions()
    res: dict[str, Any] = {}
    try:
        for name, doc in docs.items():
            b = max(8, int(doc["match"]["dims"]["batch"].get("min", 1)))  # a batch the contract covers
            if doc["family"] == "gdn":
                t = gdn_inputs(b, getattr(torch, doc["match"]["dtypes"]["state"][0]), b + 3, seed=7)
                args = {k: t[k] for k in ("q", "k", "v", "a", "b", "a_log", "dt_bias")}
                slots = slots_for(b, b + 3, pad_every=8)
                p1, p2 = t["pool"].clone(), t["pool"].clone()
                o1 = gdn.gdn_decode_fused(**args, state_pool=p1, slots=slots)
                o2 = entries[name](doc["launch"], **args, state_pool=p2, slots=slots)
                chosen = _common.decisions().get("gdn_decode_fused", [])
            else:
                x = torch.randn(b, C + ZW, device=DEV[0]).bfloat16()[:, :C]
                w = torch.randn(C, W, device=DEV[0]).bfloat16()
                pool = torch.randn(b + 3, C, W - 1, device=DEV[0]).bfloat16()
                slots = slots_for(b, b + 3, pad_every=8)
                p1, p2 = pool.clone(), pool.clone()
                o1 = conv.causal_conv1d_update(x, w, p1, slots)
                o2 = entries[name](doc["launch"], x=x, weight=w, state_pool=p2, slots=slots)
                chosen = _common.decisions().get("causal_conv1d_update", [])
            sync()
            res[name] = {"selected": chosen, "chose_it": name in chosen,
                         "bitwise": bool(torch.equal(_bits(o1), _bits(o2)) and torch.equal(_bits(p1), _bits(p2)))}
    finally:
        dispatch.reset()
        _common.reset_decisions()
    res["ok"] = all(v["bitwise"] and v["chose_it"] for v in res.values())
    res["eager_equals_replay"] = None
    return res


def run_checks(batches: list[int], entries: dict[str, Any], docs: dict[str, Any], failures: dict[str, str],
               sweep: bool = False) -> dict[str, Any]:
    checks: dict[str, Any] = {}
    for name, doc in docs.items():
        entry = entries.get(name)
        if entry is None:
            continue
        if doc["family"] == "gdn":
            cases = [(f"random_b{b}", b, None) for b in batches if in_range(doc, b)] + \
                [(c, ADV_B[0], c) for c in ADVERSARIAL]
            for label, b, adv in cases:
                checks[f"{name}/{label}"] = attempt(f"check {name} {label}", failures, gdn_case, entry, doc, b, adv,
                                                    label)
            if sweep and DEV[0] == "cuda":  # the sweep's launches, so that a winner is checked in the same record
                for label, launch in gdn_sweep(doc):
                    checks[f"{name}/{label}_b{SWEEP_CHECK_B}"] = attempt(
                        f"check {name} {label}", failures, gdn_case, entry, {**doc, "launch": launch}, SWEEP_CHECK_B,
                        None, f"{label}_b{SWEEP_CHECK_B}")
        else:
            for b in batches:
                checks[f"{name}/random_b{b}"] = attempt(f"check {name} b{b}", failures, conv_case, entry, doc, b)
    if DEV[0] == "cuda" and all(entries.get(n) is not None for n in docs):
        checks["dispatch_path"] = attempt("check dispatch path", failures, dispatch_case, entries, docs)
    return checks


# ---- timing ----------------------------------------------------------------------------------------

def n_sets(bytes_per_set: int, target: int = 192 << 20) -> int:
    """Input sets to rotate over so that together they exceed the 60 MB L2 (at least 100 MB)."""
    return max(2, min(1024, -(-target // max(1, bytes_per_set))))


def gdn_floor_bytes(b: int, state_bytes: int) -> int:
    return 2 * b * HV * DK * DV * state_bytes + b * (2 * HK * DK + HV * DV) * 2 + b * HV * DV * 2 + b * HV * 4


def conv_floor_bytes(b: int) -> int:
    return b * C * 2 + 2 * b * C * (W - 1) * 2 + b * C * 2 + C * W * 2


def warm(providers: list[Provider], what: str, failures: dict[str, str]) -> list[Provider]:
    """First use (Triton compiles) one provider at a time, so that a broken one drops alone."""
    return [p for p in providers if attempt(f"warm {p.name} {what}", failures, lambda p=p: (p.fn(0), True)[1])]


def time_gdn(b: int, doc: dict[str, Any], entry: Any, peers: dict[str, Any], samples: int, sweep: bool,
             copy_bps: float, failures: dict[str, str]) -> list[dict[str, Any]]:
    sdt = getattr(torch, doc["match"]["dtypes"]["state"][0])
    sbytes = torch.empty((), dtype=sdt).element_size()
    per_row = HV * DK * DV * sbytes
    n = n_sets(b * per_row)
    t = gdn_inputs(b, sdt, 1, seed=b)
    pool = torch.zeros(n * b + 1, HV, DK, DV, dtype=sdt, device=DEV[0]).normal_().mul_(0.3)
    slots = [torch.arange(1 + i * b, 1 + (i + 1) * b, dtype=torch.int64, device=DEV[0]) for i in range(n)]
    args = {k: t[k] for k in ("q", "k", "v", "a", "b", "a_log", "dt_bias")}
    providers = [Provider("netra", lambda i: entry(doc["launch"], **args, state_pool=pool, slots=slots[i]), n)]
    if sweep:
        def swept(la: dict[str, Any]) -> Any:
            return lambda i: entry(la, **args, state_pool=pool, slots=slots[i])

        for label, launch in gdn_sweep(doc):
            providers.append(Provider(label, swept(launch), n))
    hold: list[Any] = [pool, t]
    if "sglang" in peers:
        spool = torch.zeros(n * b + 1, HV, DV, DK, dtype=sdt, device=DEV[0]).normal_().mul_(0.3)
        sslots = [s.to(torch.int32) for s in slots]
        mixed = t["qkvz"][:, :2 * HK * DK + HV * DV]
        out = torch.empty(b, 1, HV, DV, dtype=torch.bfloat16, device=DEV[0])
        dec = peers["sglang"]["decode"]
        providers.append(Provider("sglang", lambda i: dec(
            mixed_qkv=mixed, a=t["a"], b=t["b"], A_log=t["a_log"], dt_bias=t["dt_bias"], scale=DK ** -0.5,
            initial_state=spool, out=out, ssm_state_indices=sslots[i], use_qk_l2norm_in_kernel=True), n))
        hold += [spool, sslots, out]
    if "fla" in peers:
        fq, fk, fv = (t[x].contiguous().unsqueeze(1) for x in ("q", "k", "v"))
        fa, fb = t["a"].contiguous().unsqueeze(1), t["b"].contiguous().unsqueeze(1)
        h0 = [torch.zeros(b, HV, DK, DV, dtype=sdt, device=DEV[0]).normal_().mul_(0.3) for _ in range(n)]
        frd = peers["fla"]
        providers.append(Provider("fla-core", lambda i: frd(
            fq, fk, fv, g=fa, beta=fb, scale=DK ** -0.5, initial_state=h0[i], output_final_state=True,
            use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=t["a_log"], dt_bias=t["dt_bias"],
            use_beta_sigmoid_in_kernel=True), n))
        hold += [h0, fq, fk, fv, fa, fb]
    for p in providers:
        p.hold = hold
    ok = warm(providers, f"gdn b{b} {sdt}", failures)
    stats = interleave(ok, samples=samples, deadline_s=4.0)
    floor = gdn_floor_bytes(b, sbytes)
    dtype = f"state {str(sdt).removeprefix('torch.')}"
    return [row("gdn_decode", {"batch": b, "v_heads": HV, "k_dim": DK, "v_dim": DV}, dtype, name, st,
                floor_bytes=floor, copy_bps=copy_bps, contract=doc["name"]) for name, st in stats.items()]


def time_conv(b: int, doc: dict[str, Any], entry: Any, peers: dict[str, Any], samples: int, sweep: bool,
              copy_bps: float, failures: dict[str, str]) -> list[dict[str, Any]]:
    n = n_sets(b * C * (W - 1) * 2 * 2)
    xz = torch.randn(b, C + ZW, device=DEV[0]).bfloat16()
    x = xz[:, :C]
    w = (torch.randn(C, W, device=DEV[0]) * 0.5).bfloat16()
    pool = torch.randn(n * b + 1, C, W - 1, device=DEV[0]).bfloat16()
    slots = [torch.arange(1 + i * b, 1 + (i + 1) * b, dtype=torch.int64, device=DEV[0]) for i in range(n)]
    providers = [Provider("netra", lambda i: entry(doc["launch"], x=x, weight=w, state_pool=pool, slots=slots[i]), n)]
    if sweep:
        def swept(la: dict[str, Any]) -> Any:
            return lambda i: entry(la, x=x, weight=w, state_pool=pool, slots=slots[i])

        m = doc["launch"]["meta"]
        for bc, warps, pdl in CONV_SWEEP:
            if (bc, warps, pdl) == (m["BC"], doc["launch"]["block"] // 32, int(m.get("PDL", 0))):
                continue
            launch = {**doc["launch"], "block": 32 * warps, "meta": {**m, "BC": bc, "PDL": pdl}}
            providers.append(Provider(f"sweep:BC{bc}w{warps}pdl{pdl}", swept(launch), n))
    hold: list[Any] = [xz, w, pool, slots]
    if "sglang" in peers:
        cu = peers["sglang"]["conv"]
        sslots = [s.to(torch.int32) for s in slots]
        providers.append(Provider("sglang", lambda i: cu(x, pool, w, None, "silu", conv_state_indices=sslots[i]), n))
        hold.append(sslots)
    for p in providers:
        p.hold = hold
    ok = warm(providers, f"conv b{b}", failures)
    stats = interleave(ok, samples=samples, deadline_s=4.0)
    return [row("causal_conv1d_update", {"batch": b, "channels": C, "width": W}, "bfloat16", name, st,
                floor_bytes=conv_floor_bytes(b), copy_bps=copy_bps, contract=doc["name"]) for name, st in stats.items()]


# ---- record ----------------------------------------------------------------------------------------

def speedups(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for r in rows:
        if r["provider"] != "netra":
            continue
        key = f"{r['op']} {r['dtype']} b{r['shape']['batch']}"
        same = [p for p in rows if p["op"] == r["op"] and p["dtype"] == r["dtype"] and p["shape"] == r["shape"]]
        peers = {p["provider"]: round(p["median_us"] / r["median_us"], 3) for p in same
                 if not p["provider"].startswith(("netra", "sweep:"))}
        sweeps = [p for p in same if p["provider"].startswith("sweep:")]
        best = min(same, key=lambda p: p["median_us"])
        out[key] = {"netra_us": r["median_us"], "floor_fraction": r.get("floor_fraction"),
                    "peer_over_netra": peers, "best_provider": best["provider"], "best_us": best["median_us"],
                    "sweep_best": min(sweeps, key=lambda p: p["median_us"])["provider"] if sweeps else None}
    return out


def promotion(record: dict[str, Any], docs: dict[str, Any],
              adopted: dict[str, tuple[str, str]] | None = None) -> dict[str, Any]:
    """The promotion fields (tests/kernels/test_kernel_records.py) from the record's own checks and rows.

    Per contract, over the batches its range covers: ``oracle`` (every check of it passed) and ``peers``
    (its median at or below every measured peer's at each covered batch). ``adopted`` maps a contract
    name to (the contract it was measured under, its ``sweep:`` row label), for a launch taken from a
    sweep: its rows and its sweep check then stand for it. Contracts that pass both gates are listed
    under ``promotion``, the others under ``not_promoted`` with the failing gate; ``code_objects`` pins
    the source bytes measured (sha256, as the lock pins Triton sources)."""
    import hashlib

    adopted = adopted or {}
    by_case = record["checks"]["by_case"]
    gates: dict[str, Any] = {}
    missed: dict[str, Any] = {}
    objects: dict[str, Any] = {}
    for name, doc in docs.items():
        parent, label = adopted.get(name, (name, "netra"))
        cases = [v for k, v in by_case.items() if k.startswith(f"{parent}/")
                 and ((label == "netra" and not k.split("/", 1)[1].startswith("sweep:"))
                      or (label != "netra" and k.split("/", 1)[1].startswith(label + "_")))]
        oracle = bool(cases) and all(c and c["ok"] for c in cases)
        ours = {r["shape"]["batch"]: r for r in record["rows"] if r.get("contract") == parent
                and r["provider"] == label and in_range(doc, r["shape"]["batch"])}
        lost = []
        for b, r in sorted(ours.items()):
            peers = [p for p in record["rows"] if p["op"] == r["op"] and p["dtype"] == r["dtype"]
                     and p["shape"] == r["shape"] and not p["provider"].startswith(("netra", "sweep:"))]
            best = min(peers, key=lambda p: p["median_us"]) if peers else None
            if best is None or best["median_us"] < r["median_us"]:
                lost.append({"batch": b, "ours_us": r["median_us"], "peer": best and best["provider"],
                             "peer_us": best and best["median_us"]})
        summary = {"oracle_cases": len(cases), "batches": sorted(ours), "measured_as": f"{parent}:{label}"}
        if oracle and ours and not lost:
            gates[f"{name}: oracle + at least as fast as every measured peer at every covered batch"] = \
                {"pass": True, **summary}
        else:
            missed[name] = {"oracle": oracle, "slower_than_a_peer": lost, **summary}
        src = ROOT / doc["kernel"]["source"]
        objects[name] = {"sha256": hashlib.sha256(src.read_bytes()).hexdigest(), "source": doc["kernel"]["source"]}
    return {"promotion": gates, "not_promoted": missed, "code_objects": objects}


def family_record(record: dict[str, Any], docs: dict[str, Any], family: str,
                  adopted: dict[str, tuple[str, str]] | None = None) -> dict[str, Any]:
    """The run's record restricted to one family's contracts (rows, checks, contracts, speedups), with its
    promotion fields; ``adopted`` as in `promotion` (the contracts measured under another name)."""
    adopted = adopted or {}
    names = {n for n, d in docs.items() if d["family"] == family}
    ran = names | {adopted[n][0] for n in names if n in adopted}
    rows = [r for r in record["rows"] if r.get("contract") in ran]
    by_case = {k: v for k, v in record["checks"]["by_case"].items() if k.split("/", 1)[0] in ran}
    disp = record["checks"]["by_case"].get("dispatch_path")
    if disp:
        part = {k: v for k, v in disp.items() if k in ran}
        by_case["dispatch_path"] = {**part, "ok": all(v["bitwise"] and v["chose_it"] for v in part.values()),
                                    "eager_equals_replay": None}
    failed = sum(1 for c in by_case.values() if not (c and c["ok"]))
    sub = {**record, "family": family, "rows": rows, "speedups": speedups(rows),
           "contracts": {n: c for n, c in record["contracts"].items() if n in ran},
           "checks": {"all_ok": bool(by_case) and failed == 0, "cases": len(by_case), "failed": failed,
                      "mismatches": failed,
                      "eager_equals_replay": all(c is not None and c.get("eager_equals_replay") is not False
                                                 for c in by_case.values()),
                      "by_case": by_case}}
    if rows:
        sub.update(promotion(sub, {n: d for n, d in docs.items() if n in names}, adopted))
        # accepted: the record supports promoting the contracts under "promotion" (the others, under
        # "not_promoted", stay below accepted); info when none passes
        sub["verdict"] = "accepted" if sub["promotion"] else "info"
    return sub


def git_sha() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return (sha or "unknown") + ("-dirty" if dirty else "")
    except OSError:
        return "unknown"


def load_peers(args: argparse.Namespace, failures: dict[str, str]) -> dict[str, Any]:
    peers: dict[str, Any] = {}
    if args.no_peers:
        return peers

    def sgl() -> Any:
        from netra.bench.peers import sglang_gdn

        return sglang_gdn.load(Path(args.peer_root))

    p = attempt("load sglang peer", failures, sgl)
    if p is not None:
        peers["sglang"] = p

    def fla() -> Any:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

        return fused_recurrent_gated_delta_rule

    f = attempt("load fla-core peer", failures, fla)
    if f is not None:
        peers["fla"] = f
    return peers


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--batches", default="1,8,16,32,64,128")
    ap.add_argument("--samples", type=int, default=25)
    ap.add_argument("--peer-root", default=str(ROOT / ".sglang_peer"))
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="no GPU: run the checks' logic on the CPU under TRITON_INTERPRET=1 (small batches), no timing")
    args = ap.parse_args()
    if args.cpu_smoke:
        DEV[0] = "cpu"
        args.no_peers = True
        ADVERSARIAL[:] = ADVERSARIAL[:2]
        ADV_B[0] = 2
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    batches = [int(b) for b in args.batches.split(",")]
    failures: dict[str, str] = {}
    docs = contract_docs("sm90", "gdn") | contract_docs("sm90", "conv")  # every contract of both families
    entries = {name: attempt(f"load {name}", failures, _triton.entry, doc) for name, doc in docs.items()}
    peers = load_peers(args, failures)
    device = torch.cuda.get_device_name() if DEV[0] == "cuda" else "cpu (Triton interpreter smoke run)"
    log(f"device {device}, peers {sorted(peers)}, contracts {sorted(docs)}")
    copy_bps = copy_bandwidth() if DEV[0] == "cuda" else 0.0
    log(f"copy bandwidth {copy_bps / 1e12:.3f} TB/s ({time.monotonic() - t0:.0f} s)")
    checks = run_checks(batches, entries, docs, failures, sweep=not args.no_sweep)
    log(f"checks done ({time.monotonic() - t0:.0f} s): "
        f"{sum(1 for c in checks.values() if c and c['ok'])}/{len(checks)} ok")
    rows: list[dict[str, Any]] = []
    for name, doc in docs.items():
        if entries.get(name) is None or DEV[0] == "cpu":
            continue
        for b in batches:
            if not in_range(doc, b):
                continue
            timer = time_gdn if doc["family"] == "gdn" else time_conv
            got = attempt(f"time {name} b{b}", failures, timer, b, doc, entries[name], peers, args.samples,
                          not args.no_sweep, copy_bps, failures)
            rows += got or []
            torch.cuda.empty_cache()
        log(f"timed {name} ({time.monotonic() - t0:.0f} s)")
    all_ok = bool(checks) and all(c is not None and c["ok"] for c in checks.values())
    failed = sum(1 for c in checks.values() if not (c and c["ok"]))
    summary = {"cases": len(checks), "failed": failed, "mismatches": failed,
               "eager_equals_replay": all(c is not None and c["eager_equals_replay"] is not False for c in checks.values())}
    record = {
        "kind": "kernel", "family": "gdn", "target": "sm90", "device": device,
        "git_sha": git_sha(), "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": "timeout 240 python scripts/gpu/gdn.py --out $OUT/gdn", "status": "measured" if rows else "not_run",
        **({} if rows else {"reason": "no timing rows (CPU smoke run, or every timing step failed: see failures)"}),
        "copy_bandwidth_Bps": copy_bps, "torch": torch.__version__,
        "peers": {"sglang": "0.5.23 wheel files (fused_recurrent_gated_delta_rule_packed_decode, causal_conv1d_update)"
                  if "sglang" in peers else "not loaded",
                  "fla-core": "0.6.0 fused_recurrent_gated_delta_rule (gate + beta sigmoid in kernel; per-batch "
                              "initial state, no pool gather, FP32 final state)" if "fla" in peers else "not loaded"},
        "contracts": {n: {"launch": d["launch"], "numerics": d["numerics"]} for n, d in docs.items()},
        "checks": {"all_ok": all_ok, **summary, "by_case": checks}, "failures": failures, "rows": rows,
        "speedups": speedups(rows), "verdict": "info", "wall_s": round(time.monotonic() - t0, 1), "log": LOG,
    }
    for family in ("conv", "gdn"):  # one record per family (a contract cites its family's record)
        sub = family_record(record, docs, family)
        (args.out / f"{family}_h200.json").write_text(json.dumps(sub, indent=1, default=str))
    print_table(record)
    print(f"records: {args.out}/gdn_h200.json, conv_h200.json  checks all_ok={all_ok}  failures={len(failures)}  "
          f"wall {record['wall_s']} s")
    return 0 if all_ok and not failures else 1


def print_table(record: dict[str, Any]) -> None:
    bad = {k: v for k, v in record["checks"]["by_case"].items() if not (v and v["ok"])}
    for k, v in bad.items():
        print(f"  ! check {k}: {json.dumps(v, default=str)[:300]}")
    print(f"{'op':<22}{'dtype':<16}{'B':>4}  {'provider':<20}{'median us':>10}{'floor':>8}")
    for r in record["rows"]:
        if r["provider"].startswith("sweep:"):
            continue
        print(f"{r['op']:<22}{r['dtype']:<16}{r['shape']['batch']:>4}  {r['provider']:<20}{r['median_us']:>10.2f}"
              f"{r.get('floor_fraction', 0):>8.3f}")
    for key, s in record["speedups"].items():
        print(f"{key:<40} netra {s['netra_us']:.2f} us  peers/netra {s['peer_over_netra']}  best {s['best_provider']}")


if __name__ == "__main__":
    sys.exit(main())
