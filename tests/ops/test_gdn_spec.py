"""Speculative verify and commit of the GDN layers (`gdn.gdn_verify`, `gdn.gdn_commit`) against a plain sequence of
decode steps (conv update + fused GDN decode), on the CPU (the ops' reference path).

verify: its outputs are bitwise T decode steps' outputs and both pools are untouched. commit: the pools are bitwise
``count[r]`` decode steps of the full batch, for every count 1..T, mixed counts (0 included: a request that commits
nothing) in one batch, pad rows, fp32 and bf16 state, several layers at once.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from netra.ops import conv, gdn

HK, HV, DK, DV, K = 2, 4, 16, 8, 4
C = 2 * HK * DK + HV * DV


def make_layer(g: torch.Generator, n_slots: int, state_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {
        "conv_weight": (torch.randn(C, K, generator=g) * 0.5).bfloat16(),
        "a_log": torch.log(torch.rand(HV, generator=g) * 15 + 1),
        "dt_bias": (torch.randn(HV, generator=g) * 0.5).bfloat16(),
        "conv_pool": torch.randn(n_slots, C, K - 1, generator=g).bfloat16(),
        "ssm_pool": (torch.randn(n_slots, HV, DK, DV, generator=g) * 0.3).to(state_dtype),
    }


def make_block(g: torch.Generator, rows: int) -> dict[str, torch.Tensor]:
    """Pre-conv rows and the raw a | b projections as the engine makes them (a, b strided views of one output)."""
    ba = torch.randn(rows, 2 * HV, generator=g).bfloat16()
    return {"qkv": torch.randn(rows, C, generator=g).bfloat16(), "b": ba[:, :HV], "a": ba[:, HV:]}


def decode_steps(layer: dict[str, torch.Tensor], block: dict[str, torch.Tensor], slots: torch.Tensor, tokens: int,
                 conv_pool: torch.Tensor, ssm_pool: torch.Tensor, snapshot_after: list[int] | None = None
                 ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """The oracle: ``tokens`` plain decode steps of the whole batch (the engine's decode branch of `_gdn`), on the
    given pools in place; returns the outputs [B·T, Hv, dv] and, per request r, its slot's (conv, state) rows after
    ``snapshot_after[r]`` steps."""
    bsz = slots.shape[0]
    xs = block["qkv"].unflatten(0, (bsz, tokens))
    as_, bs_ = block["a"].unflatten(0, (bsz, tokens)), block["b"].unflatten(0, (bsz, tokens))
    outs, snaps = [], [(conv_pool[s].clone(), ssm_pool[s].clone()) for s in slots.tolist()]
    for j in range(tokens):
        y = conv.causal_conv1d_update(xs[:, j], layer["conv_weight"], conv_pool, slots)
        q = y[:, :HK * DK].reshape(bsz, HK, DK)
        k = y[:, HK * DK:2 * HK * DK].reshape(bsz, HK, DK)
        v = y[:, 2 * HK * DK:].reshape(bsz, HV, DV)
        outs.append(gdn.gdn_decode_fused(q, k, v, as_[:, j], bs_[:, j], layer["a_log"], layer["dt_bias"],
                                         ssm_pool, slots))
        for r, s in enumerate(slots.tolist()):
            if snapshot_after is not None and snapshot_after[r] == j + 1:
                snaps[r] = (conv_pool[s].clone(), ssm_pool[s].clone())
    return torch.stack(outs, dim=1).flatten(0, 1), snaps


def test_split_heads() -> None:
    assert gdn.gdn_split_heads(8192, 32, 128, 128) == 16
    assert gdn.gdn_split_heads(C, HV, DK, DV) == HK
    with pytest.raises(ValueError, match="do not split"):
        gdn.gdn_split_heads(C + 1, HV, DK, DV)


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 3, 8])
def test_verify_is_t_decode_steps_and_writes_nothing(state_dtype: torch.dtype, tokens: int) -> None:
    g = torch.Generator().manual_seed(tokens)
    layer = make_layer(g, 9, state_dtype)
    slots = torch.tensor([5, 0, 2, 8])  # a pad row among them
    block = make_block(g, slots.shape[0] * tokens)
    conv_before, ssm_before = layer["conv_pool"].clone(), layer["ssm_pool"].clone()
    o = gdn.gdn_verify(block["qkv"], block["a"], block["b"], layer["conv_weight"], layer["a_log"], layer["dt_bias"],
                       layer["conv_pool"], layer["ssm_pool"], slots, tokens)
    assert torch.equal(layer["conv_pool"], conv_before) and torch.equal(layer["ssm_pool"], ssm_before)
    want, _ = decode_steps(layer, block, slots, tokens, conv_before.clone(), ssm_before.clone())
    assert o.shape == (slots.shape[0] * tokens, HV, DV) and o.dtype == torch.bfloat16
    assert torch.equal(o, want)
    assert torch.equal(o.unflatten(0, (4, tokens))[1], torch.zeros(tokens, HV, DV, dtype=o.dtype))


def test_verify_reads_only_its_slots_pad_slot_content_ignored() -> None:
    """Poisoned pool rows (slot 0 and the slots not in the batch) never reach the outputs."""
    g = torch.Generator().manual_seed(7)
    layer = make_layer(g, 6, torch.float32)
    slots, tokens = torch.tensor([3, 1]), 4
    block = make_block(g, 2 * tokens)
    o = gdn.gdn_verify(block["qkv"], block["a"], block["b"], layer["conv_weight"], layer["a_log"], layer["dt_bias"],
                       layer["conv_pool"], layer["ssm_pool"], slots, tokens)
    for other in (0, 2, 4, 5):
        layer["conv_pool"][other] = float("nan")
        layer["ssm_pool"][other] = float("nan")
    o2 = gdn.gdn_verify(block["qkv"], block["a"], block["b"], layer["conv_weight"], layer["a_log"],
                        layer["dt_bias"], layer["conv_pool"], layer["ssm_pool"], slots, tokens)
    assert torch.isfinite(o).all() and torch.equal(o, o2)


def stacked(layers: list[dict[str, torch.Tensor]], blocks: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {
        "qkv_stash": torch.stack([b["qkv"] for b in blocks]), "a_stash": torch.stack([b["a"] for b in blocks]),
        "b_stash": torch.stack([b["b"] for b in blocks]),
        "conv_weights": torch.stack([x["conv_weight"] for x in layers]),
        "a_log": torch.stack([x["a_log"] for x in layers]), "dt_bias": torch.stack([x["dt_bias"] for x in layers]),
        "conv_pool": torch.stack([x["conv_pool"] for x in layers]),
        "ssm_pool": torch.stack([x["ssm_pool"] for x in layers]),
    }


def check_commit(state_dtype: torch.dtype, slots: list[int], counts: list[int], tokens: int, n_layers: int,
                 seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    layers = [make_layer(g, 10, state_dtype) for _ in range(n_layers)]
    blocks = [make_block(g, len(slots) * tokens) for _ in range(n_layers)]
    st = stacked(layers, blocks)
    conv_before, ssm_before = st["conv_pool"].clone(), st["ssm_pool"].clone()
    slots_t, count_t = torch.tensor(slots), torch.tensor(counts)
    gdn.gdn_commit(st["qkv_stash"], st["a_stash"], st["b_stash"], st["conv_weights"], st["a_log"], st["dt_bias"],
                   st["conv_pool"], st["ssm_pool"], slots_t, count_t, tokens)
    for li in range(n_layers):
        conv_ref, ssm_ref = conv_before[li].clone(), ssm_before[li].clone()
        _, snaps = decode_steps(layers[li], blocks[li], slots_t, tokens, conv_ref, ssm_ref, snapshot_after=counts)
        for r, s in enumerate(slots):
            if s == gdn.PAD_SLOT:
                continue
            assert torch.equal(st["conv_pool"][li, s], snaps[r][0]), (li, r, counts[r])
            assert torch.equal(st["ssm_pool"][li, s], snaps[r][1]), (li, r, counts[r])
        untouched = [i for i in range(10) if i not in slots or i == gdn.PAD_SLOT]
        assert torch.equal(st["conv_pool"][li, untouched], conv_before[li, untouched])
        assert torch.equal(st["ssm_pool"][li, untouched], ssm_before[li, untouched])


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("count", [1, 2, 3, 4, 5])
def test_commit_every_count_is_count_decode_steps(state_dtype: torch.dtype, count: int) -> None:
    check_commit(state_dtype, [4, 7, 1], [count] * 3, tokens=5, n_layers=2, seed=count)


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_commit_mixed_counts_pad_rows_and_zero(state_dtype: torch.dtype) -> None:
    check_commit(state_dtype, [4, 0, 7, 9, 2, 0], [3, 6, 1, 6, 0, 2], tokens=6, n_layers=3, seed=11)


def test_commit_then_verify_continues_from_the_committed_state() -> None:
    """The speculative cycle: verify a block, commit its accepted prefix, verify the next block; the second verify's
    outputs are bitwise the decode steps that follow the committed ones."""
    g = torch.Generator().manual_seed(3)
    layer = make_layer(g, 6, torch.float32)
    slots, tokens, counts = torch.tensor([2, 5]), 4, [2, 4]
    blocks = [make_block(g, 2 * tokens) for _ in range(2)]
    ref_conv, ref_ssm = layer["conv_pool"].clone(), layer["ssm_pool"].clone()
    st = stacked([layer], blocks[:1])
    gdn.gdn_commit(st["qkv_stash"], st["a_stash"], st["b_stash"], st["conv_weights"], st["a_log"], st["dt_bias"],
                   st["conv_pool"], st["ssm_pool"], slots, torch.tensor(counts), tokens)
    o = gdn.gdn_verify(blocks[1]["qkv"], blocks[1]["a"], blocks[1]["b"], layer["conv_weight"], layer["a_log"],
                       layer["dt_bias"], st["conv_pool"][0], st["ssm_pool"][0], slots, tokens)
    # the oracle: per request, its accepted tokens then the next block's tokens, one decode step each
    for r, s in enumerate(slots.tolist()):
        seq = {key: torch.cat([blocks[0][key].unflatten(0, (2, tokens))[r, :counts[r]],
                               blocks[1][key].unflatten(0, (2, tokens))[r]]) for key in ("qkv", "a", "b")}
        n = counts[r] + tokens
        want, _ = decode_steps(layer, seq, torch.tensor([s]), n, ref_conv.clone(), ref_ssm.clone())
        assert torch.equal(o.unflatten(0, (2, tokens))[r], want[counts[r]:])


def test_ops_are_registered() -> None:
    from netra.ops import OPS

    assert OPS["gdn_verify"] == OPS["gdn_commit"] == "netra.ops.gdn"


def _sig(op: str, dims: dict[str, int], dtypes: dict[str, str], layouts: dict[str, str]) -> Any:
    from netra.contract import Signature

    return Signature(target="sm90", op=op, dims=tuple(sorted(dims.items())), dtypes=tuple(sorted(dtypes.items())),
                     layouts=tuple(sorted(layouts.items())), graph_phase="capture")


def decode_signatures(batch: int, state: str) -> tuple[Any, Any]:
    """The engine's decode-step signatures at ``batch`` rows (Qwen3.6-35B-A3B): conv update, fused GDN decode."""
    conv_sig = _sig("causal_conv1d_update", {"batch": batch, "channels": 8192, "width": 4},
                    {"x": "bfloat16", "w": "bfloat16", "state": "bfloat16", "slots": "int64"},
                    {"x": "strided", "w": "contiguous_align16", "state": "contiguous_align16",
                     "slots": "contiguous_align16"})
    gdn_sig = _sig("gdn_decode_fused", {"batch": batch, "k_heads": 16, "v_heads": 32, "k_dim": 128, "v_dim": 128},
                   {"q": "bfloat16", "k": "bfloat16", "v": "bfloat16", "a": "bfloat16", "b": "bfloat16",
                    "a_log": "float32", "dt_bias": "bfloat16", "state": state, "slots": "int64"},
                   {"q": "strided", "k": "strided", "v": "strided", "a": "strided", "b": "strided",
                    "a_log": "contiguous_align16", "dt_bias": "contiguous_align16", "state": "contiguous_align16",
                    "slots": "contiguous_align16"})
    return conv_sig, gdn_sig


def replay_signature(op: str, batch: int, tokens: int, state: str) -> Any:
    dims = {"batch": batch, "block_tokens": tokens, "k_heads": 16, "v_heads": 32, "k_dim": 128, "v_dim": 128,
            "channels": 8192, "width": 4}
    dtypes = {"qkv": "bfloat16", "a": "bfloat16", "b": "bfloat16", "w": "bfloat16", "a_log": "float32",
              "dt_bias": "bfloat16", "conv_state": "bfloat16", "state": state, "slots": "int64"}
    layouts = {"qkv": "strided", "a": "strided", "b": "strided", "w": "contiguous_align16",
               "a_log": "contiguous_align16", "dt_bias": "contiguous_align16", "conv_state": "contiguous_align16",
               "state": "contiguous_align16", "slots": "contiguous_align16"}
    if op == "gdn_commit":
        dims["layers"] = 30
        dtypes["count"] = "int64"
        layouts["count"] = "contiguous_align16"
    return _sig(op, dims, dtypes, layouts)


@pytest.mark.parametrize("op", ["gdn_verify", "gdn_commit"])
@pytest.mark.parametrize("state", ["float32", "bfloat16"])
def test_replay_contracts_pair_with_the_decode_tactics_at_every_batch(op: str, state: str) -> None:
    """With experiments selected, every batch 1-128 and T 1-16 finds a verify/commit contract, and it is the one
    whose tile is the decode step's at that batch (so `_decode_pairing` lets it run); at the default maturity none is
    selected (the ops run the decode steps looped)."""
    from netra.catalog import Catalog
    from netra.dispatch import plan

    cat = Catalog.load()
    for batch in range(1, 129):
        for tokens in (1, 16):
            fused = plan(replay_signature(op, batch, tokens, state), cat, "experiment").contract
            assert fused is not None, (op, batch, tokens)
            assert plan(replay_signature(op, batch, tokens, state), cat).contract is None
        conv_sig, gdn_sig = decode_signatures(batch, state)
        conv_dec, gdn_dec = plan(conv_sig, cat, "experiment").contract, plan(gdn_sig, cat, "experiment").contract
        assert gdn.pairing_problem(fused, conv_dec, gdn_dec) is None, (batch, fused.name, gdn_dec)


def test_pairing_problem_names_the_mismatch() -> None:
    from netra.catalog import Catalog

    cat = Catalog.load()
    fused = cat.by_name("gdn_verify_f32_hv32")  # BV 64, 4 warps
    conv_dec = cat.by_name("conv1d_update_c8192_w4")
    assert gdn.pairing_problem(fused, conv_dec, cat.by_name("gdn_decode_f32_hv32")) is None
    assert "conv step runs its reference" in str(gdn.pairing_problem(fused, None, cat.by_name("gdn_decode_f32_hv32")))
    assert "GDN decode step runs its reference" in str(gdn.pairing_problem(fused, conv_dec, None))
    why = gdn.pairing_problem(fused, conv_dec, cat.by_name("gdn_decode_f32_small_hv32"))
    assert why is not None and "BV 16" in why and "BV 64" in why
    assert "not the Triton conv update" in str(gdn.pairing_problem(fused, fused, fused))


def test_replay_grids_fit_cuda_limits_across_the_domain() -> None:
    """The GDN steps kernel's grid at the domain's corners: the (layer, request, head) axis can reach 64 x 128 x 32
    programs, so it is the x axis (2^31 - 1); y and z stay within 65535."""
    from netra.catalog import Catalog
    from netra.runtime import grid_size

    for c in Catalog.load().contracts:
        if c.op not in ("gdn_verify", "gdn_commit"):
            continue
        dims = {name: rng.hi for name, rng in c.dims.items()}
        grid = grid_size(c.launch["grid"], {**dims, **c.launch["meta"]})
        assert grid[0] < 2 ** 31 and all(g <= 65535 for g in grid[1:]), (c.name, grid)
        assert grid[0] == dims.get("layers", 1) * dims["batch"] * dims["v_heads"], (c.name, grid)
