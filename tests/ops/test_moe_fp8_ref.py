"""CPU oracle tests for the MoE decode references (netra/ops/moe_fp8.py), cross-checked against the
engine's own layer reference (netra/ops/moe.py, netra/ops/fp8.py) so both describe one numerics."""

from __future__ import annotations

import pytest
import torch

from netra.ops import fp8
from netra.ops.moe import expert_mlp_ref
from netra.ops.moe_fp8 import (
    MoeShapeError,
    act_quant_ref,
    moe_routed_ref,
    quant_group_ref,
    quant_weight_blocks_ref,
    route_meta_ref,
    route_ref,
    silu_mul_ref,
)


def test_group_quant_matches_engine_helper_and_bounds() -> None:
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(7, 512, generator=g) * torch.logspace(-6, 3, 7).unsqueeze(1)).to(torch.bfloat16)
    x[3] = 0
    q, s = quant_group_ref(x)
    eq, es = fp8.quantize_per_token_group(x)
    assert torch.equal(q.view(torch.uint8), eq.view(torch.uint8))  # CPU: scalar and tensor division agree
    assert torch.equal(s, es)
    deq = q.float().reshape(7, 4, 128) * s.unsqueeze(-1)
    err = (deq.reshape(7, 512) - x.float()).abs()
    assert bool((err <= x.float().abs() * 2**-3 + s.repeat_interleave(128, 1) * 2**-9).all())
    assert torch.equal(s[3], torch.full((4,), 1e-10 / 448.0))


def test_act_quant_ref_is_the_two_step_definition() -> None:
    g = torch.Generator().manual_seed(1)
    gu = torch.randn(9, 1024, generator=g).to(torch.bfloat16)
    h = silu_mul_ref(gu)
    expect = (torch.nn.functional.silu(gu[:, :512].float()) * gu[:, 512:].float()).to(torch.bfloat16)
    assert torch.equal(h, expect)
    q, s = act_quant_ref(gu)
    q2, s2 = quant_group_ref(expect)
    assert torch.equal(q.view(torch.uint8), q2.view(torch.uint8)) and torch.equal(s, s2)
    with pytest.raises(MoeShapeError):
        act_quant_ref(gu[:, :1023])


def test_route_ref_ties_go_to_lowest_index() -> None:
    logits = torch.zeros(3, 256, dtype=torch.bfloat16)
    logits[1, 200] = 1.0
    logits[1, 5] = 1.0
    logits[2, 17:40] = 2.0
    ids, w, shared = route_ref(logits, torch.tensor([0.0, 1.0, -1.0], dtype=torch.bfloat16))
    assert ids[0].tolist() == list(range(8))
    assert ids[1].tolist() == [5, 200, 0, 1, 2, 3, 4, 6]
    assert ids[2].tolist() == list(range(17, 25))
    assert torch.allclose(w.sum(-1), torch.ones(3))
    assert torch.allclose(w[0], torch.full((8,), 0.125))
    assert shared is not None and torch.allclose(shared, torch.sigmoid(torch.tensor([0.0, 1.0, -1.0])))


def test_route_meta_groups_by_expert_then_token() -> None:
    ids = torch.tensor([[3, 1], [1, 7]], dtype=torch.int32)
    w = torch.tensor([[0.6, 0.4], [0.9, 0.1]])
    meta = route_meta_ref(ids, w, torch.tensor([0.5, 0.25]))
    assert meta.slot_expert == [1, 3, 7, 256]
    assert meta.slot_start == [0, 2, 3, 4, 6]
    assert meta.route_token == [0, 1, 0, 1, 0, 1]
    assert meta.route_dst == [1, 9, 0, 10, 8, 17]
    assert meta.route_w == pytest.approx([0.4, 0.9, 0.6, 0.1, 0.5, 0.25])


def test_moe_routed_ref_matches_engine_expert_mlp() -> None:
    g = torch.Generator().manual_seed(2)
    e, m = 6, 3
    w13, s13 = quant_weight_blocks_ref(torch.randn(e, 1024, 2048, generator=g) * 0.02)
    w2, s2 = quant_weight_blocks_ref(torch.randn(e, 2048, 512, generator=g) * 0.04)
    x = torch.randn(m, 2048, generator=g).to(torch.bfloat16)
    ids = torch.tensor([[0, 1, 2, 3, 4, 5, 0, 1]] * m, dtype=torch.int32)[:, :8]
    ids[1] = torch.tensor([5, 4, 3, 2, 1, 0, 5, 4])
    ids = ids[:, :6].contiguous()  # distinct experts per token
    w = torch.softmax(torch.randn(m, 6, generator=g), -1)
    got = moe_routed_ref(x, ids, w, w13, s13, w2, s2)
    routes = torch.zeros(m, 6, 2048)
    for t in range(m):
        for k in range(6):
            ex = int(ids[t, k])
            routes[t, k] = expert_mlp_ref(x[t:t + 1], fp8.block_dequantize_weight(w13[ex], s13[ex]),
                                          fp8.block_dequantize_weight(w2[ex], s2[ex]), w[t, k:k + 1], True)[0].float()
    want = routes.sum(1).to(torch.bfloat16)
    assert torch.allclose(got.float(), want.float(), rtol=1e-2, atol=1e-3)
    rel = (got.float() - want.float()).norm() / want.float().norm()
    assert rel < 2e-3


def test_launch_structs_match_contract_layouts() -> None:
    """The host ctypes structs must equal each contract's params_layout (the device checks its own)."""
    import ctypes

    from netra.catalog import Catalog
    from netra.ops import moe_fp8

    cat = Catalog.load()
    structs = {"act_quant": moe_fp8._ActQuantParams, "route": moe_fp8._RouteParams, "align": moe_fp8._RouteParams,
               "gate_up": moe_fp8._GemmParams, "down": moe_fp8._GemmParams}
    for key, name in moe_fp8.CONTRACTS.items():
        layout = dict(cat.by_name(name).kernel["params_layout"])
        st = structs[key]
        assert ctypes.sizeof(st) == layout.pop("size"), name
        for field, off in layout.items():
            if field == "meta":  # the nested RouteMeta starts with num_slots
                field = "num_slots"
            assert getattr(st, field).offset == off, (name, field)


def test_v3_launch_structs_and_contracts() -> None:
    """v3 contracts: host struct == params_layout, PDL on, dynamic smem == what the source's ring needs,
    the unfused build differs only by -DMOE_FUSE_ACT=0, and both down builds are distinct ops (no ambiguity)."""
    import ctypes
    import re

    from netra.catalog import Catalog
    from netra.ops import moe_fp8
    from netra.settings import REPO_ROOT

    cat = Catalog.load()
    names = [moe_fp8.CONTRACTS_V3["gate_up"], moe_fp8.CONTRACTS_V3["down"], moe_fp8.DOWN_V3_UNFUSED]
    src = (REPO_ROOT / "kernels/sm90/moe/expert_stream.cu").read_text()
    macro = {m.group(1): m.group(2) for m in re.finditer(r"^#define (\w+) (\d+)", src, re.M)}
    item, ncw = int(macro["ITEM_BYTES"]), int(macro["DN_NCW"])
    hbuf = int(macro["HCHUNK"]) * int(macro["HROW"]) + int(macro["HCHUNK"]) * 16
    smem = {names[0]: int(macro["GU_STAGES"]) * (item + 16),
            names[1]: int(macro["DN_STAGES"]) * (item + 16) + ncw * hbuf,
            names[2]: int(macro["DN_STAGES"]) * (item + 16) + ncw * hbuf}
    for name in names:
        c = cat.by_name(name)
        layout = dict(c.kernel["params_layout"])
        assert ctypes.sizeof(moe_fp8._GemmParamsV3) == layout.pop("size"), name
        for field, off in layout.items():
            assert getattr(moe_fp8._GemmParamsV3, field).offset == off, (name, field)
        nc = int(macro["GU_NCW"]) if c.op == "moe_gate_up" else ncw
        assert c.launch["pdl"] is True and c.launch["block"] == 32 * (nc + 1)
        assert c.launch["smem_bytes"] == smem[name] <= 227 * 1024, name
        assert c.kernel["source"] == "kernels/sm90/moe/expert_stream.cu"
    assert cat.by_name(names[1]).kernel["flags"] == []
    assert cat.by_name(names[2]).kernel["flags"] == ["-DMOE_FUSE_ACT=0"]
    assert cat.by_name(names[1]).op != cat.by_name(names[2]).op
    assert cat.by_name(names[1]).workspace["bytes"] == 32 * moe_fp8.MAX_TOKENS * 4
    for key in ("route", "align"):  # v1's source built for PDL: same struct, own code object
        c, c1 = cat.by_name(moe_fp8.CONTRACTS_V3[key]), cat.by_name(moe_fp8.CONTRACTS[key])
        assert c.kernel["params_layout"] == c1.kernel["params_layout"] and c.kernel["source"] == c1.kernel["source"]
        assert c.kernel["flags"] == ["-DMOE_PDL=1"] and c.launch["pdl"] is True and c.maturity == "experiment"


def test_v3_constructor_refuses_bad_variants() -> None:
    import pytest

    from netra.ops.moe_fp8 import MoeSm90

    for kwargs in ({"variant": "v2"}, {"variant": "v1", "fuse_act": False}, {"variant": "v3", "fuse_act": False,
                                                                             "debug_h": True}):
        with pytest.raises(ValueError):
            MoeSm90(0, **kwargs)


def test_sglang_align_ref_matches_sglang_docstring_example() -> None:
    from netra.bench.peers.sglang_moe import align_block_ref

    ids = torch.tensor([[2, 3, 4], [1, 2, 4], [1, 3, 4], [1, 2, 3]], dtype=torch.int32)
    s, e, n = torch.empty(40, dtype=torch.int32), torch.empty(10, dtype=torch.int32), torch.empty(1, dtype=torch.int32)
    align_block_ref(ids, 5, 4, s, e, n)
    assert int(n) == 16
    assert s[:16].tolist() == [3, 6, 9, 12, 0, 4, 10, 12, 1, 7, 11, 12, 2, 5, 8, 12]
    assert e[:4].tolist() == [1, 2, 3, 4]


def test_peer_loader_refuses_a_missing_wheel(tmp_path: object) -> None:
    from pathlib import Path

    from netra.bench.peers.sglang_moe import load

    with pytest.raises(FileNotFoundError, match="SGLang peer files missing"):
        load(Path(str(tmp_path)))


def test_records_from_the_committed_h200_runs(tmp_path: object) -> None:
    """The report step turns a run's ours.json/peer.json into valid records with the issue's gates."""
    import json
    from pathlib import Path

    from netra.bench.kernels_moe import write_records
    from netra.records import validate
    from netra.settings import REPO_ROOT

    src = REPO_ROOT / "results" / "sm90" / "moe_runs" / "final_v1_vs_peer"
    paths = write_records(src, Path(str(tmp_path)), "", "test")
    docs = {p.stem: json.loads(p.read_text()) for p in paths}
    for d in docs.values():
        validate(d)
    layer = docs["moe_layer"]
    assert layer["checks"]["within_tolerance"] and layer["checks"]["eager_equals_replay"]
    sp = layer["speedups"]
    assert sp["1"]["vs_sglang_graph"] > 1.0 > sp["128"]["vs_sglang_graph"]
    assert layer["verdict"] == "rejected"  # slower than SGLang from 8 tokens on
    assert docs["moe_route"]["verdict"] == "accepted"
    aq = docs["moe_act_quant"]
    assert aq["checks"]["bitwise_equal"] and aq["verdict"] == "rejected"  # < 1.5x at 1 and 16 tokens


def test_route_align_fill_their_pointers_on_every_call() -> None:
    """load_tactic shares one params buffer per (contract, device) between MoeSm90 instances: align /
    route must point it at THIS instance's buffers at every launch (run5's v3 NaN: a second instance
    re-pointed the shared buffer at construction and the first one's GEMMs read empty metadata)."""
    import ctypes
    import threading

    from netra.ops import moe_fp8

    class _Buf:
        def __init__(self, base: int, shape: tuple[int, ...] = (4,)) -> None:
            self.base, self.shape = base, shape

        def data_ptr(self) -> int:
            return self.base

    class _Tactic:
        def __init__(self) -> None:
            self.params = ctypes.create_string_buffer(ctypes.sizeof(moe_fp8._RouteParams))
            self.lock = threading.Lock()
            self.workspace = _Buf(0x9000)
            self.seen: list[tuple[int, int, int]] = []

        def launch(self, grid: int, stream: int) -> None:
            p = moe_fp8._RouteParams.from_buffer(self.params)
            self.seen.append((p.num_slots, p.route_token, p.xq))

    shared = {"route": _Tactic(), "align": _Tactic()}
    names = ("topk_ids", "topk_w", "logits", "shared_logit", "num_slots", "slot_expert", "slot_start",
             "route_token", "route_dst", "route_w", "xq", "xs", "shared_w")

    def make(base: int) -> moe_fp8.MoeSm90:
        o = object.__new__(moe_fp8.MoeSm90)
        o.t = shared  # type: ignore[assignment]
        for i, n in enumerate(names):
            setattr(o, n, _Buf(base + 16 * i))
        o._rt = moe_fp8._RouteParams.from_buffer(shared["route"].params)
        o._al = moe_fp8._RouteParams.from_buffer(shared["align"].params)
        o._stream = lambda: 0  # type: ignore[method-assign]
        o._check_x = lambda x: 2  # type: ignore[method-assign]
        return o

    a, b = make(0x10000), make(0x20000)
    x = _Buf(0x1, (2, moe_fp8.HIDDEN))
    ids = torch.zeros(2, moe_fp8.TOPK, dtype=torch.int32)
    wts = torch.zeros(2, moe_fp8.TOPK, dtype=torch.float32)
    for o in (a, b, a):
        o.align(x, ids, wts)  # type: ignore[arg-type]
        o.route(x, x, None)  # type: ignore[arg-type]
    for key in ("align", "route"):
        seen = shared[key].seen
        assert [s[0] for s in seen] == [a.num_slots.data_ptr(), b.num_slots.data_ptr(), a.num_slots.data_ptr()]
        assert [s[1] for s in seen] == [a.route_token.data_ptr(), b.route_token.data_ptr(), a.route_token.data_ptr()]
        assert [s[2] for s in seen] == [a.xq.data_ptr(), b.xq.data_ptr(), a.xq.data_ptr()]


def test_v3_tuning_builds() -> None:
    """Tuning builds: same source/struct/PDL as the base v3 contracts, own flags, distinct ops, smem as the
    -D geometry needs; bad tune arguments are refused before any GPU work."""
    import ctypes

    from netra.catalog import Catalog
    from netra.ops import moe_fp8
    from netra.ops.moe_fp8 import MoeSm90

    cat = Catalog.load()
    base = {"gate_up": cat.by_name(moe_fp8.CONTRACTS_V3["gate_up"]), "down": cat.by_name(moe_fp8.CONTRACTS_V3["down"])}
    ops = {c.op for c in base.values()}
    hbuf = lambda hc: hc * 528 + hc * 16  # noqa: E731
    want = {"moe_gate_up_v3p_e256": (224, 6 * (32768 + 16), ["-DGU_PIPE=1"]),
            "moe_down_v3p_e256": (160, 4 * (32768 + 16) + 4 * hbuf(16), ["-DDN_PIPE=1"]),
            "moe_down_v3w6_e256": (224, 6 * (32768 + 16) + 6 * hbuf(8),
                                   ["-DDN_PIPE=1", "-DDN_NCW=6", "-DDN_STAGES=6", "-DHCHUNK=8"]),
            "moe_gate_up_v3ps_e256": (224, 6 * (32768 + 16), ["-DGU_PIPE=1", "-DTSPLIT=1"]),
            "moe_down_v3w6s_e256": (224, 6 * (32768 + 16) + 6 * hbuf(8),
                                    ["-DDN_PIPE=1", "-DDN_NCW=6", "-DDN_STAGES=6", "-DHCHUNK=8", "-DTSPLIT=1",
                                     "-DGU_PIPE=1"]),
            "moe_down_v3w6sb_e256": (224, 6 * (32768 + 16) + 6 * hbuf(8),
                                     ["-DDN_PIPE=1", "-DDN_NCW=6", "-DDN_STAGES=6", "-DHCHUNK=8", "-DTSPLIT=1",
                                      "-DGU_PIPE=1", "-DDN_BATCH=1"]),
            # round 3: streaming down (own symbol): two group h buffers, 256 B workspace (grid barrier)
            "moe_down_v3st_e256": (224, 6 * (32768 + 16) + 2 * hbuf(16),
                                   ["-DDN_STREAM=1", "-DDN_NCW=6", "-DDN_STAGES=6", "-DHCHUNK=16", "-DTSPLIT=1",
                                    "-DGU_PIPE=1"]),
            "moe_down_v3st8_e256": (224, 6 * (32768 + 16) + 2 * hbuf(8),
                                    ["-DDN_STREAM=1", "-DDN_NCW=6", "-DDN_STAGES=6", "-DHCHUNK=8", "-DTSPLIT=1",
                                     "-DGU_PIPE=1"]),
            # round 4: st8 + per-group w2 scales / last ticket sums first (experiment until run)
            "moe_down_v3st8w_e256": (224, 6 * (32768 + 16) + 2 * hbuf(8),
                                     ["-DDN_STREAM=1", "-DDN_NCW=6", "-DDN_STAGES=6", "-DHCHUNK=8", "-DTSPLIT=1",
                                      "-DGU_PIPE=1", "-DDN_WSG=1"]),
            # round 4: the small-M pair (3 warps / 3 stages each: both fit on one SM, ~211 KB)
            "moe_gate_up_v3ps3_e256": (128, 3 * (32768 + 16), ["-DGU_PIPE=1", "-DTSPLIT=1", "-DGU_NCW=3",
                                                                "-DGU_STAGES=3"]),
            "moe_down_v3w3s_e256": (128, 3 * (32768 + 16) + 3 * hbuf(8),
                                    ["-DDN_PIPE=1", "-DDN_NCW=3", "-DDN_STAGES=3", "-DHCHUNK=8", "-DTSPLIT=1",
                                     "-DGU_PIPE=1"])}
    for tune in ("p", "p6", "p6s", "p6sb", "st", "st8", "st8w", "s3"):
        for key, name in moe_fp8.V3_TUNES[tune].items():
            c = cat.by_name(name)
            b = base[key]
            symbol = "moe_down_v3_stream" if tune.startswith("st") and key == "down" else b.kernel["symbol"]
            assert c.kernel["source"] == b.kernel["source"] and c.kernel["symbol"] == symbol
            assert c.kernel["params_layout"] == b.kernel["params_layout"]
            assert ctypes.sizeof(moe_fp8._GemmParamsV3) == c.kernel["params_layout"]["size"]
            # measured on the H200 (run8/run9/run11, results/sm90/moe_layer_v3.json): the st8 pair
            # verified, every other tuning build rejected with the run that showed it losing
            assert c.launch["pdl"] is True
            assert c.maturity in ("verified", "rejected") and c.evidence, name
            assert c.maturity == ("verified" if tune == "st8" else "rejected") or key == "gate_up", name
            assert (c.launch["block"], c.launch["smem_bytes"], c.kernel["flags"]) == want[name], name
            assert c.launch["smem_bytes"] + 2 * 1032 <= 227 * 1024  # + the token-split item map (static)
            ops.add(c.op)
    assert len(ops) == 13  # base gate_up + down, v3p / v3ps / v3ps3 gate_up, five tuned downs, three streaming
    pair = sum(cat.by_name(n).launch["smem_bytes"] + 2 * 1032 + 1024 for n in moe_fp8.V3_TUNES["s3"].values())
    assert pair <= 228 * 1024  # + static item map + the driver's 1 KB per CTA: both CTAs fit on one SM
    assert frozenset(moe_fp8.V3_TUNES["s3"].values()) == moe_fp8.CARVEOUT_MAX
    auto3 = moe_fp8.V3_TUNES["auto3"]
    assert auto3 == {**moe_fp8.V3_TUNES["st8"], "gate_up_small": moe_fp8.V3_TUNES["s3"]["gate_up"],
                     "down_small": moe_fp8.V3_TUNES["s3"]["down"]}
    # round 4: "auto" = the st8 pair + p6s's down for calls below AUTO_STREAM_MIN_M tokens (no new code
    # object: both downs read the gate|up cache of the one gate_up build; each keeps its own workspace)
    auto = moe_fp8.V3_TUNES["auto"]
    assert auto == {"gate_up": moe_fp8.V3_TUNES["st8"]["gate_up"], "down": moe_fp8.V3_TUNES["st8"]["down"],
                    "down_small": moe_fp8.V3_TUNES["p6s"]["down"]}
    assert moe_fp8.V3_TUNES["p6s"]["gate_up"] == auto["gate_up"]
    assert 1 < moe_fp8.AUTO_STREAM_MIN_M <= 16
    for kwargs in ({"variant": "v3", "tune": "x"}, {"variant": "v1", "tune": "p"},
                   {"variant": "v3", "fuse_act": False, "tune": "p"}):
        with pytest.raises(ValueError):
            MoeSm90(0, **kwargs)  # type: ignore[arg-type]


def test_m1_contract_struct_and_tune() -> None:
    """Round 5 m1 (one cooperative kernel for the 1-token routed layer): host struct == params_layout,
    cooperative launch of M1_CTAS x 256 threads, smem as the source's layout, the lock's ptxas report clean,
    and tune "m1" = st8's pair (M > 1 / shared / fallback) + the megakernel."""
    import ctypes
    import json
    import re
    from pathlib import Path

    from netra.catalog import Catalog
    from netra.ops import moe_fp8

    cat = Catalog.load()
    c = cat.by_name("moe_m1_e256_k8")
    layout = dict(c.kernel["params_layout"])
    assert layout.pop("size") == ctypes.sizeof(moe_fp8._M1Params) == 96
    assert layout == {n: getattr(moe_fp8._M1Params, n).offset for n, *_ in moe_fp8._M1Params._fields_}
    assert c.launch["cooperative"] is True and not c.launch.get("pdl", False)
    assert c.maturity == "verified" and c.evidence and c.dims["tokens"].hi == 1 and c.kernel["symbol"] == "moe_m1"
    root = Path(__file__).resolve().parents[2]
    src = (root / c.kernel["source"]).read_text()
    defs = dict(re.findall(r"^#define (M1_CTAS|M1_THREADS) (\d+)", src, re.M))
    assert int(defs["M1_CTAS"]) == moe_fp8.M1_CTAS and int(defs["M1_THREADS"]) == c.launch["block"] == 256
    # layout: 4 x 32 KB gate|up tiles + 8 x 8 KB down tiles + xq 2 KB + xs 64 + h 8 x 528 + hs 128 + y 512 + bars 64
    assert c.launch["smem_bytes"] == 4 * 32768 + 8 * 8192 + 2048 + 64 + 8 * 528 + 128 + 512 + 64
    assert c.launch["smem_bytes"] + 1024 + 1024 <= 228 * 1024  # + static (1 KB aligned) + driver reserve
    assert c.workspace["bytes"] >= 33 * 4 and c.workspace["zeroed"] is True
    lock = json.loads((root / "kernels" / "lock.json").read_text())
    entry = next(e for e in lock["code_objects"] if e["name"] == c.name)
    res = entry["resources"]
    assert res["spill_loads"] == res["spill_stores"] == res["stack_bytes"] == 0
    assert res["registers"] * 256 <= 65536
    m1 = moe_fp8.V3_TUNES["m1"]
    assert {k: v for k, v in m1.items() if k != "m1"} == moe_fp8.V3_TUNES["st8"] and m1["m1"] == c.name
    nc = cat.by_name(moe_fp8.V3_TUNES["m1nc"]["m1"])  # the plain-launch twin: same code object, own op
    assert nc.kernel == c.kernel and nc.launch == {**c.launch, "cooperative": False, "grid": nc.launch["grid"]}
    assert nc.op != c.op and nc.workspace == c.workspace
    assert {k: v for k, v in moe_fp8.V3_TUNES["m1nc"].items() if k != "m1"} == moe_fp8.V3_TUNES["st8"]


@pytest.mark.parametrize("tune", ["m1", "ms", "m1s"])
def test_one_kernel_host_dispatch(tune: str) -> None:
    """tune "m1" / "ms" on the host: align at 1 / up to 8 routed-only tokens launches nothing and experts
    launches the one-kernel layer once (grid M1_CTAS) with this instance's pointers; with the shared route,
    above its token limit, or when experts asks for the shared route after a deferred align, the align kernel
    runs and the st8 GEMMs follow."""
    import ctypes
    import threading

    from netra.ops import moe_fp8

    class _Buf:
        def __init__(self, base: int, shape: tuple[int, ...] = (4,)) -> None:
            self.base, self.shape = base, shape

        def data_ptr(self) -> int:
            return self.base

        def is_contiguous(self) -> bool:
            return True

        def __getitem__(self, _k: object) -> _Buf:
            return self

    log: list[tuple[str, int]] = []

    class _Tactic:
        def __init__(self, key: str, struct: type[ctypes.Structure]) -> None:
            self.key = key
            self.params = ctypes.create_string_buffer(ctypes.sizeof(struct))
            self.lock = threading.Lock()
            self.workspace = _Buf(0x9000)

        def launch(self, grid: int, stream: int) -> None:
            log.append((self.key, grid))

    t = {"align": _Tactic("align", moe_fp8._RouteParams), "gate_up": _Tactic("gate_up", moe_fp8._GemmParamsV3),
         "down": _Tactic("down", moe_fp8._GemmParamsV3), "m1": _Tactic("m1", moe_fp8._M1Params), "ms": _Tactic("ms", moe_fp8._MsParams)}
    o = object.__new__(moe_fp8.MoeSm90)
    o.t = t  # type: ignore[assignment]
    o.variant, o.fuse_act, o.num_sms = "v3", True, 132
    for i, n in enumerate(("topk_ids", "topk_w", "logits", "shared_logit", "num_slots", "slot_expert", "slot_start",
                           "route_token", "route_dst", "route_w", "xq", "xs", "gu", "y", "out", "aq_q", "aq_s")):
        setattr(o, n, _Buf(0x10000 + 16 * i))
    o.dbg_hq = o.dbg_hs = None
    o._al = moe_fp8._RouteParams.from_buffer(t["align"].params)
    o._gu = moe_fp8._GemmParamsV3.from_buffer(t["gate_up"].params)
    o._dn = moe_fp8._GemmParamsV3.from_buffer(t["down"].params)
    o._gu_small = o._dn_small = None
    o._m1 = moe_fp8._M1Params.from_buffer(t["m1"].params) if tune in ("m1", "m1s") else None
    o._ms = moe_fp8._MsParams.from_buffer(t["ms"].params) if tune in ("ms", "m1s") else None
    o._m1_pending = None
    o._stream = lambda: 0  # type: ignore[method-assign]
    w = [_Buf(0x100 * (i + 1), (moe_fp8.NUM_EXPERTS + 1, 1)) for i in range(4)]

    def call(m: int, shared_align: bool, shared: bool) -> list[tuple[str, int]]:
        log.clear()
        o._check_x = lambda x: m  # type: ignore[method-assign]
        x = _Buf(0x1, (m, moe_fp8.HIDDEN))
        ids = torch.zeros(m, moe_fp8.TOPK, dtype=torch.int32)
        wts = torch.zeros(m, moe_fp8.TOPK, dtype=torch.float32)
        o.align(x, ids, wts, _Buf(0x2) if shared_align else None)  # type: ignore[arg-type]
        o.experts(x, *w, shared)  # type: ignore[arg-type,call-arg]
        return list(log)

    top = moe_fp8.ONE_KERNEL_MAX_TOKENS["m1" if tune == "m1" else "ms"]
    one = "ms" if tune == "ms" else "m1"  # the kernel at one token
    assert call(1, False, False) == [(one, moe_fp8.M1_CTAS)]
    p = o._m1 if one == "m1" else o._ms
    assert p is not None
    assert (p.x, p.w13, p.w13_scale, p.w2, p.w2_scale) == (0x1, 0x100, 0x200, 0x300, 0x400)
    assert p.out == o.out.data_ptr() and p.bar == 0x9000
    if one == "m1":
        assert p.gu == o.gu.data_ptr() and p.dbg_hq is None
    else:
        assert p.hbuf == o.gu.data_ptr() and p.M == 1
    if tune != "m1":
        q = o._ms
        assert q is not None
        assert call(top, False, False) == [("ms", moe_fp8.M1_CTAS)]
        assert top == q.M
        assert call(2, False, False) == [("ms", moe_fp8.M1_CTAS)] and q.M == 2
    st8 = [("gate_up", 132), ("down", 132)]
    assert call(1, True, True) == [("align", 2), *st8]
    assert call(1, False, True) == [("align", 2), *st8]  # deferred align, then run after all
    assert call(top + 1, False, False) == [("align", 1 + (top + 4) // 4), *st8]
    assert o._m1_pending is None
