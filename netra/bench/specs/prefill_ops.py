"""The prefill tactics of issue 20 at the prefill chunk shapes the dp1-h200 profile runs: the causal conv1d over
prefill chunks (``conv1d_prefill_c8192_w4``, beside SGLang 0.5.23's ``causal_conv1d_fn``), the three Gemma/gated
RMSNorms at prefill rows (``rmsnorm_gemma_prefill``, ``add_rmsnorm_gemma_prefill``, ``gated_rmsnorm_prefill``) and
GDN's b|a projections through cuBLAS (``linear_group_bf16_prefill``).

Cases: the conv at 8 x 1024, 1 x 8192, 64 x 128 tokens and odd lengths (1, 2, 3, 37, 1000, 5); the norms at 8192 rows
of 2048, 8320 rows of 2048 and 262144 heads of 128 (8192 tokens of 32 heads); the b|a projections (2048 -> 32 + 32)
at 8192, 8320 and 1151 rows.

Check (the same functions on the GPU and the smoke path): outputs under the contract's numerics (`netra.validate.
compare`) against the op's reference; the conv's inputs hostile (NaN, Inf, +-0, the largest finite values, NaNs of
non-canonical payloads, x a strided view), its pool rows of the chunks' slots bitwise the reference's and every other
row untouched; the norms' inputs with one row 1e4 larger. On the GPU also the op through dispatch (minimum maturity
``experiment``): it selects the contract and gives its entry's output bitwise. These contracts run eagerly (prefill
is eager; the conv's chunk lengths are host lists): no graph replay to compare, and the timing is eager too.

Providers: ``netra`` (the contract's entry at its launch), ``reference`` (the fallback dispatch would run) and, for
the conv, ``sglang`` (loaded unchanged from ``.sglang_peer`` through `netra.bench.peers.sglang_loader`; its output
against ours recorded in the case's check). ``--prefill-sweep`` adds a case (no contract) timing the conv's launch
neighbours (BT 16/32/64 x BC 128/256 x UNROLL) at 8 x 1024, each checked first.

Smoke (CPU, interpreter): the conv at 256 channels (two chunk layouts), each norm at a few rows, the b|a projections
at 5 rows; checks only.

    python -m netra.bench.harness prefill_ops --out $OUT/prefill_ops     # carry .sglang_peer
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from typing import Any

from netra.bench.harness import Case, CaseBuilder, Spec
from netra.bench.specs.gdn_decode import PEER_ROOT, by_columns, n_sets, same, tactic, warm

BITWISE = {"policy": "bitwise"}
CONV = "conv1d_prefill_c8192_w4"
CHANNELS = 8192
CONV_LENS = ([1024] * 8, [8192], [128] * 64, [1, 2, 3, 37, 1000, 5])
SMOKE_LENS = ([1, 2, 3, 37, 5], [40, 8])
# (contract, op, rows, width): the route's op name is the decisions' key
NORMS = (("rmsnorm_gemma_prefill", "rmsnorm_gemma", 8192, 2048),
         ("add_rmsnorm_gemma_prefill", "add_rmsnorm_gemma", 8320, 2048),
         ("gated_rmsnorm_prefill", "gated_rmsnorm", 262144, 128))
LINEAR = "linear_group_bf16_prefill"
LINEAR_ROWS = (8192, 8320, 1151)
EPS = 1e-6
PEERS: dict[str, Any] = {}


# ---- conv prefill ----------------------------------------------------------------------------------------------

def conv_inputs(c: int, lens: list[int], device: str) -> tuple[Any, Any, Any, list[int]]:
    """x [T, C] a strided view of the in-projection (z beside it) with hostile values (channels 0-6 of token 0; NaNs
    of non-canonical payloads in channels 100-101), weight, pool, the chunks' slots (distinct, descending, none on
    slot 0)."""
    import torch

    t = sum(lens)
    g = torch.Generator(device=device).manual_seed(t + len(lens))
    xz = torch.randn(t, c + c // 2, generator=g, device=device).bfloat16()
    x = xz[:, :c]
    w = (torch.randn(c, 4, generator=g, device=device) * 0.5).bfloat16()
    pool = torch.randn(len(lens) + 9, c, 3, generator=g, device=device).bfloat16()
    x[0, :7] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 3e38, -3e38]).bfloat16()
    x[lens[0] - 1, 100:102] = torch.tensor([0x7FA1, -0x003F], dtype=torch.int16).view(torch.bfloat16).to(device)
    return x, w, pool, [3 + i for i in range(len(lens))][::-1]


def check_conv(doc: Mapping[str, Any], launch: Mapping[str, Any], c: int, lens: list[int],
               device: str) -> dict[str, Any]:
    from netra.ops import conv
    from netra.validate.compare import compare

    x, w, pool, slots = conv_inputs(c, lens, device)
    mine, ref = pool.clone(), pool.clone()
    y = tactic(doc)(dict(launch), x=x, weight=w, state_pool=mine, seq_slots=slots, q_lens=lens)
    y_ref = conv.causal_conv1d_prefill_ref(x, w, ref, slots, lens)
    others = [s for s in range(pool.shape[0]) if s not in slots]
    res: dict[str, Any] = {"y": by_columns(doc["numerics"], y, y_ref, 7), "state": compare(BITWISE, mine, ref),
                           "untouched": compare(BITWISE, mine[others], pool[others]),
                           "eager_equals_replay": None}  # eager only: the chunk lengths are host lists
    ok = res["y"]["ok"] and res["state"]["ok"] and res["untouched"]["ok"]
    if device == "cuda" and launch == doc["launch"]:
        from netra.ops import _common

        _common.reset_decisions()
        p2 = pool.clone()
        y2 = conv.causal_conv1d_prefill(x, w, p2, slots, lens)
        res["dispatch"] = {"selected": _common.decisions().get("causal_conv1d_prefill", []),
                           "bitwise": same(y2, y) and same(p2, mine)}
        res["dispatch"]["chose_it"] = doc["name"] in res["dispatch"]["selected"]
        ok = ok and res["dispatch"]["bitwise"] and res["dispatch"]["chose_it"]
    return {**res, "ok": ok}


def conv_launches(doc: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    base = doc["launch"]
    out = {}
    for bt in (16, 32, 64):
        for bc in (128, 256):
            for unroll in (0, 1):
                la = {**base, "block": 64 if bc == 256 else 32,
                      "meta": {**base["meta"], "BT": bt, "BC": bc, "UNROLL": unroll}}
                if la != base:
                    out[f"sweep:BT{bt}_BC{bc}_U{unroll}"] = la
    return out


def conv_case(doc: dict[str, Any], lens: list[int], sweep: bool, c: int = CHANNELS, device: str = "cuda") -> Case:
    import torch

    from netra.ops import conv

    t, fn = sum(lens), tactic(doc)
    n = n_sets(t * c * 2, most=8) if device == "cuda" else 2
    xs = [torch.randn(t, c + c // 2, device=device).bfloat16()[:, :c] for _ in range(n)]
    w = (torch.randn(c, 4, device=device) * 0.5).bfloat16()
    pool = torch.randn(len(lens) + 9, c, 3, device=device).bfloat16()
    slots = [3 + i for i in range(len(lens))][::-1]

    def ours(la: Mapping[str, Any]) -> Callable[[int], Any]:
        return lambda i: fn(dict(la), x=xs[i], weight=w, state_pool=pool, seq_slots=slots, q_lens=lens)

    providers: dict[str, Callable[[int], Any]] = {"netra": ours(doc["launch"])}
    launches = conv_launches(doc) if sweep else {}
    providers.update({label: ours(la) for label, la in launches.items()})
    info: dict[str, Any] = {}
    hold: list[Any] = [xs, w, pool]
    if not sweep:
        providers["reference"] = lambda i: conv.causal_conv1d_prefill_ref(xs[i], w, pool, slots, lens)
        if "sglang" in PEERS:
            peer = PEERS["sglang"]
            qsl = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
            idx = torch.tensor(slots, dtype=torch.int32, device=device)
            init = torch.ones(len(lens), dtype=torch.bool, device=device)
            providers["sglang"] = lambda i: peer(xs[i].t(), w, None, pool, qsl, lens, cache_indices=idx,
                                                 has_initial_state=init, activation="silu")
            hold += [qsl, idx, init]
    dropped: dict[str, str] = {}
    providers = warm(providers, dropped, device)
    if "sglang" in providers:
        try:  # the same job from the same state: SGLang's output against ours (reported, not deciding)
            start = pool.clone()
            mine = fn(doc["launch"], x=xs[0], weight=w, state_pool=start.clone(), seq_slots=slots, q_lens=lens)
            theirs = PEERS["sglang"](xs[0].t(), w, None, start.clone(), qsl, lens, cache_indices=idx,
                                     has_initial_state=init, activation="silu")
            info["sglang_against_netra"] = by_columns(doc["numerics"], theirs.t(), mine, 7)
        except Exception as exc:
            info["sglang_against_netra"] = f"{type(exc).__name__}: {exc}"[:300]

    def check() -> dict[str, Any]:
        res = check_conv(doc, doc["launch"], c, lens, device)
        if sweep:
            res["variants"] = {label: check_conv(doc, la, c, lens, device) for label, la in launches.items()}
            res["ok"] = res["ok"] and all(v["ok"] for v in res["variants"].values())
        return {**res, **info, **({"providers_dropped": dropped} if dropped else {})}

    shape = f"{len(lens)}x{lens[0]}" if len(set(lens)) == 1 else "+".join(map(str, lens))
    return Case(key=f"conv {shape}" + (" sweep" if sweep else ""), op="causal_conv1d_prefill",
                shape={"sequences": len(lens), "tokens": t, "channels": c, "width": 4}, dtype="bfloat16",
                providers=providers, check=check, contract=None if sweep else doc["name"], n_inputs=n,
                floor_bytes=4 * t * c, hold=hold, graph=False, min_calls=8)


# ---- norms -----------------------------------------------------------------------------------------------------

def norm_inputs(op: str, rows: int, width: int, device: str, seed: int) -> dict[str, Any]:
    """x (one row 1e4 larger), residual, weight, z (a strided view, as the engine's slice of the in-projection)."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)

    def t(scale: float, cols: int = width) -> Any:
        return (torch.randn(rows, cols, generator=g, device=device) * scale).bfloat16()

    x = t(3.0)
    x[0] *= 1e4
    ins = {"x": x, "weight": (torch.randn(width, generator=g, device=device) * 0.1).bfloat16()}
    if op == "add_rmsnorm_gemma":
        ins["residual"] = t(5.0)
    if op == "gated_rmsnorm":
        ins["z"] = t(2.0, 2 * width)[:, :width]
    return ins


def norm_ref(op: str, ins: Mapping[str, Any]) -> Any:
    from netra.ops import norm

    if op == "gated_rmsnorm":
        return norm.gated_rmsnorm_ref(ins["x"], ins["z"], ins["weight"], EPS)
    if op == "add_rmsnorm_gemma":
        return norm.add_rmsnorm_ref(ins["x"], ins["residual"], ins["weight"], EPS)
    return norm.rmsnorm_ref(ins["x"], ins["weight"], EPS)


def norm_op(op: str, ins: Mapping[str, Any]) -> Any:
    from netra.ops import norm

    if op == "gated_rmsnorm":
        return norm.gated_rmsnorm(ins["x"], ins["z"], ins["weight"], EPS)
    if op == "add_rmsnorm_gemma":
        return norm.add_rmsnorm(ins["x"], ins["residual"], ins["weight"], EPS)
    return norm.rmsnorm(ins["x"], ins["weight"], EPS)


def outputs(got: Any) -> list[Any]:
    return list(got) if isinstance(got, (tuple, list)) else [got]


def check_norm(doc: Mapping[str, Any], op: str, rows: int, width: int, device: str) -> dict[str, Any]:
    """Output (and the add's new residual) under the contract's numerics against the reference."""
    from netra.validate.compare import compare

    ins = norm_inputs(op, rows, width, device, rows)
    got = outputs(tactic(doc)(doc["launch"], **ins, eps=EPS))
    want = outputs(norm_ref(op, ins))
    res: dict[str, Any] = {"out": compare(doc["numerics"], got[0], want[0]), "eager_equals_replay": None}
    if len(want) > 1:
        res["residual"] = compare(doc["numerics"], got[1], want[1])
    ok = all(v["ok"] for k, v in res.items() if k in ("out", "residual"))
    if device == "cuda":
        from netra.ops import _common

        _common.reset_decisions()
        via = outputs(norm_op(op, ins))
        res["dispatch"] = {"selected": _common.decisions().get(op, []),
                           "bitwise": all(same(a, b) for a, b in zip(via, got, strict=True))}
        res["dispatch"]["chose_it"] = doc["name"] in res["dispatch"]["selected"]
        ok = ok and res["dispatch"]["bitwise"] and res["dispatch"]["chose_it"]
    return {**res, "ok": ok}


def norm_case(doc: dict[str, Any], op: str, rows: int, width: int, device: str = "cuda") -> Case:
    fn = tactic(doc)
    n = n_sets(rows * width * 2 * 3, most=8) if device == "cuda" else 2
    sets = [norm_inputs(op, rows, width, device, rows + i) for i in range(n)]
    providers: dict[str, Callable[[int], Any]] = {"netra": lambda i: fn(doc["launch"], **sets[i], eps=EPS),
                                                  "reference": lambda i: norm_ref(op, sets[i])}
    reads = 3 if op != "rmsnorm_gemma" else 1
    return Case(key=f"{op} {rows}x{width}", op=op, shape={"rows": rows, "width": width}, dtype="bfloat16",
                providers=providers, check=partial(check_norm, doc, op, rows, width, device), contract=doc["name"],
                n_inputs=n, floor_bytes=rows * width * 2 * (reads + (2 if op == "add_rmsnorm_gemma" else 1)),
                hold=sets, graph=False, min_calls=8)


# ---- the b|a projections through cuBLAS ------------------------------------------------------------------------

def linear_inputs(m: int, device: str, seed: int = 0) -> tuple[Any, list[Any]]:
    import torch

    from netra.ops.linear import Weight

    g = torch.Generator(device=device).manual_seed(m + 1000 * seed)
    x = (torch.randn(m, 2048, generator=g, device=device) * 2).bfloat16()
    ws = [Weight((torch.randn(32, 2048, generator=g, device=device) * 2048 ** -0.5).bfloat16()) for _ in range(2)]
    return x, ws


def check_linear(doc: Mapping[str, Any], m: int, device: str) -> dict[str, Any]:
    import torch

    from netra.ops.linear import linear_group, linear_group_ref
    from netra.validate.compare import compare

    x, ws = linear_inputs(m, device)
    got = tactic(doc)(doc["launch"], x=x, weights=ws, out_dtype=torch.bfloat16)
    want = linear_group_ref(x, ws)
    res: dict[str, Any] = {"parts": [compare(doc["numerics"], a, b) for a, b in zip(got, want, strict=True)],
                           "eager_equals_replay": None}
    ok = all(p["ok"] for p in res["parts"])
    if device == "cuda":
        from netra.ops import _common

        _common.reset_decisions()
        via = linear_group(x, ws)
        res["dispatch"] = {"selected": _common.decisions().get("linear_group", []),
                           "bitwise": all(same(a, b) for a, b in zip(via, got, strict=True))}
        res["dispatch"]["chose_it"] = doc["name"] in res["dispatch"]["selected"]
        ok = ok and res["dispatch"]["bitwise"] and res["dispatch"]["chose_it"]
    return {**res, "ok": ok}


def linear_case(doc: dict[str, Any], m: int, device: str = "cuda") -> Case:
    import torch

    from netra.ops.linear import linear_group_ref

    fn = tactic(doc)
    n = n_sets(m * 2048 * 2, most=8) if device == "cuda" else 2
    sets = [linear_inputs(m, device, i) for i in range(n)]  # distinct activations past the L2, each its weights
    return Case(key=f"linear_group {m}x2048->32+32", op="linear_group", shape={"m": m, "k": 2048, "n": [32, 32]},
                dtype="bfloat16",
                providers={"netra": lambda i: fn(doc["launch"], x=sets[i][0], weights=sets[i][1],
                                                 out_dtype=torch.bfloat16),
                           "reference": lambda i: linear_group_ref(sets[i][0], sets[i][1])},
                check=partial(check_linear, doc, m, device), contract=doc["name"], n_inputs=n,
                floor_bytes=m * 2048 * 2 + 64 * 2048 * 2 + m * 64 * 2, hold=sets, graph=False, min_calls=8)


# ---- the spec --------------------------------------------------------------------------------------------------

def check_case(key: str, op: str, doc: Mapping[str, Any], check: Callable[[], Mapping[str, Any]],
               **shape: Any) -> Case:
    return Case(key=key, op=op, shape=shape, dtype="bfloat16", check=check, contract=doc["name"])


def cases(opts: argparse.Namespace) -> Iterator[CaseBuilder]:
    from netra.catalog import contract_doc

    conv_doc = contract_doc(CONV)
    for lens in CONV_LENS:
        yield partial(conv_case, conv_doc, list(lens), False)
    for name, op, rows, width in NORMS:
        yield partial(norm_case, contract_doc(name), op, rows, width)
    for m in LINEAR_ROWS:
        yield partial(linear_case, contract_doc(LINEAR), m)
    if getattr(opts, "prefill_sweep", False):
        yield partial(conv_case, conv_doc, list(CONV_LENS[0]), True)


def smoke() -> Iterator[CaseBuilder]:
    from netra.catalog import contract_doc

    conv_doc = contract_doc(CONV)
    for lens in SMOKE_LENS:
        yield partial(check_case, f"conv {'+'.join(map(str, lens))}", "causal_conv1d_prefill", conv_doc,
                      partial(check_conv, conv_doc, conv_doc["launch"], 256, list(lens), "cpu"), tokens=sum(lens))
    for name, op, _, width in NORMS:
        rows = 5 if width > 128 else 96  # the gated norm: 3 tokens of 32 heads
        doc = contract_doc(name)
        yield partial(check_case, f"{op} {rows}x{width}", op, doc, partial(check_norm, doc, op, rows, width, "cpu"),
                      rows=rows, width=width)
    lin = contract_doc(LINEAR)
    yield partial(check_case, "linear_group 5x2048->32+32", "linear_group", lin, partial(check_linear, lin, 5, "cpu"),
                  m=5)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prefill-sweep", action="store_true",
                   help="prefill_ops: also time (and check) the conv's launch neighbours at 8 x 1024")


def setup(opts: argparse.Namespace) -> dict[str, Any]:
    PEERS.clear()
    if getattr(opts, "smoke", False):
        return {"peers": "none (smoke path)"}
    import importlib

    from netra import dispatch
    from netra.bench.peers.sglang_loader import install

    dispatch.reset(dispatch.Dispatcher(min_maturity="experiment"))
    try:
        install(PEER_ROOT)
        PEERS["sglang"] = importlib.import_module("sglang.kernels.ops.mamba.causal_conv1d_triton").causal_conv1d_fn
        peer = "0.5.23 wheel files: causal_conv1d_fn (the Triton varlen kernel its GDN backend runs at prefill)"
    except Exception as exc:
        peer = f"not loaded: {type(exc).__name__}: {exc}"[:300]
    return {"peers": {"sglang": peer}, "min_maturity": "experiment"}


SPEC = Spec(name="prefill_ops", family="prefill", doc="conv prefill, prefill norms and b|a projections (issue 20)",
            cases=cases, smoke=smoke,
            contracts=(CONV, *(n for n, _, _, _ in NORMS), LINEAR), setup=setup, add_arguments=add_arguments)
