"""The causal conv1d update tactic (kernels/sm90/conv/conv1d_update.py) under Triton's CPU
interpreter, against `causal_conv1d_update_ref` per the contract: output within the declared
tolerance, the state pool bitwise equal, pad rows inert."""

from __future__ import annotations

import pytest
import torch

from netra.ops import conv
from netra.validate.compare import compare

pytestmark = pytest.mark.triton_interp

CONTRACT = "conv1d_update_c8192_w4"


def make(bsz: int, channels: int, seed: int, n_slots: int = 9) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x as the engine makes it (a strided view of the qkv|z projection), weight [C, 4], pool [slots, C, 3]."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(bsz, channels + 96, generator=g).bfloat16()[:, :channels]
    w = (torch.randn(channels, 4, generator=g) * 0.5).bfloat16()
    pool = torch.randn(n_slots, channels, 3, generator=g).bfloat16()
    return x, w, pool


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN payloads included), where torch.equal says NaN != NaN."""
    return a.dtype == b.dtype and torch.equal(a.view(torch.int16), b.view(torch.int16))


def check(entry, doc, x: torch.Tensor, w: torch.Tensor, pool: torch.Tensor, slots: torch.Tensor,
          launch: dict | None = None) -> None:
    mine, ref = pool.clone(), pool.clone()
    y = entry(launch or doc["launch"], x=x, weight=w, state_pool=mine, slots=slots)
    y_ref = conv.causal_conv1d_update_ref(x, w, ref, slots)
    rep = compare(doc["numerics"], y, y_ref)
    assert rep["ok"], rep
    assert bits_equal(mine, ref), "state pool differs from the reference's (the shift must be exact)"
    pad = slots == conv.PAD_SLOT
    assert torch.equal(y[pad], torch.zeros_like(y[pad]))
    assert torch.equal(mine[conv.PAD_SLOT], pool[conv.PAD_SLOT])


@pytest.mark.parametrize("seed", [0, 1])
def test_fresh_random_with_pad_rows(interp_entry, seed: int) -> None:
    entry, doc = interp_entry(CONTRACT)
    x, w, pool = make(11, 8192, seed)  # 11 rows: a partial row block
    slots = torch.tensor([3, 0, 5, 8, 1, 0, 2, 4, 6, 7, 0])
    check(entry, doc, x, w, pool, slots)


def test_sixteen_rows_pad_every_eighth(interp_entry) -> None:
    """The H200 check's shape of slots (B >= 8: every 8th row on the pad slot, the rest a permutation),
    with a NaN/Inf/extreme row, as netra/bench/specs/gdn_decode.py builds it."""
    entry, doc = interp_entry(CONTRACT)
    x, w, pool = make(16, 8192, seed=5, n_slots=19)
    x[0, :4] = torch.tensor([float("nan"), float("inf"), 3e38, -3e38]).bfloat16()
    slots = torch.randperm(16, generator=torch.Generator().manual_seed(5)) + 1
    slots[7::8] = conv.PAD_SLOT
    check(entry, doc, x, w, pool, slots)


def test_channels_not_a_multiple_of_the_block(interp_entry) -> None:
    entry, doc = interp_entry(CONTRACT)
    x, w, pool = make(3, 600, seed=2)
    check(entry, doc, x, w, pool, torch.tensor([2, 1, 0]))


@pytest.mark.parametrize("case", ["huge", "tiny", "nan_inf", "nan_payloads", "zero_weight"])
def test_adversarial(interp_entry, case: str) -> None:
    entry, doc = interp_entry(CONTRACT)
    x, w, pool = make(4, 8192, seed=3)
    if case == "huge":  # SiLU's exp overflows for large negative sums, saturates for large positive ones
        x[0].fill_(1e30)
        x[1].fill_(-1e30)
        pool[5].mul_(1e20)
    elif case == "tiny":
        x.mul_(1e-35)
        pool.mul_(1e-35)
    elif case == "nan_inf":
        x[0, :7] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 3e38, -3e38]).bfloat16()
    elif case == "nan_payloads":  # non-canonical NaNs in x and in the state: the shift keeps their bits
        payloads = torch.tensor([0x7FA1, -0x003F, 0x7F81, -0x0001], dtype=torch.int16).view(torch.bfloat16)
        x[0, 100:104] = payloads
        pool[2, 200:204, 1] = payloads
    elif case == "zero_weight":
        w.zero_()
    check(entry, doc, x, w, pool, torch.tensor([2, 5, 7, 0]))


def test_consecutive_steps_are_the_reference(interp_entry) -> None:
    """Four steps: the state after each is bitwise the reference's, so the window slides exactly."""
    entry, doc = interp_entry(CONTRACT)
    _, w, pool = make(2, 8192, seed=4)
    mine, ref = pool.clone(), pool.clone()
    slots = torch.tensor([4, 1])
    for step in range(4):
        x, _, _ = make(2, 8192, seed=10 + step)
        y = entry(doc["launch"], x=x, weight=w, state_pool=mine, slots=slots)
        y_ref = conv.causal_conv1d_update_ref(x, w, ref, slots)
        assert compare(doc["numerics"], y, y_ref)["ok"], step
        assert bits_equal(mine, ref), step


def test_reference_pad_rows_leave_the_pool_alone() -> None:
    x, w, pool = make(3, 64, seed=5)
    before = pool.clone()
    y = conv.causal_conv1d_update_ref(x, w, pool, torch.tensor([0, 2, 0]))
    assert torch.equal(pool[0], before[0]) and not torch.equal(pool[2], before[2])
    assert torch.equal(y[0], torch.zeros_like(y[0])) and torch.equal(y[2], torch.zeros_like(y[2]))


PREFILL = "conv1d_prefill_c8192_w4"


def check_prefill(entry, doc, x: torch.Tensor, w: torch.Tensor, pool: torch.Tensor, slots: list[int],
                  lens: list[int], launch: dict | None = None) -> None:
    mine, ref = pool.clone(), pool.clone()
    y = entry(launch or doc["launch"], x=x, weight=w, state_pool=mine, seq_slots=slots, q_lens=lens)
    y_ref = conv.causal_conv1d_prefill_ref(x, w, ref, slots, lens)
    rep = compare(doc["numerics"], y, y_ref)
    assert rep["ok"], rep
    assert y.is_contiguous() and y.dtype == x.dtype
    assert bits_equal(mine, ref), "state pool differs from the reference's (the new state moves values)"
    untouched = [s for s in range(pool.shape[0]) if s not in slots]
    assert bits_equal(mine[untouched], pool[untouched])


@pytest.mark.parametrize("unroll", [1, 0], ids=["unrolled", "loop"])
@pytest.mark.parametrize("lens", [[40, 1, 2, 3, 33], [1], [2, 2], [64]])
def test_prefill_chunks_of_every_length(interp_entry, lens: list[int], unroll: int) -> None:
    """Chunks shorter than the window (1, 2 tokens: the new state keeps part of the old), exactly 3, across a
    token tile (33, 40 with BT 32), a strided x (a view of the qkv|z projection), channels not a block multiple."""
    entry, doc = interp_entry(PREFILL)
    x, w, pool = make(sum(lens), 600, seed=len(lens), n_slots=9)
    slots = [7, 2, 5, 1, 8][:len(lens)]
    launch = {**doc["launch"], "meta": {**doc["launch"]["meta"], "UNROLL": unroll}}
    check_prefill(entry, doc, x, w, pool, slots, lens, launch)


def test_prefill_full_width_with_hostile_values(interp_entry) -> None:
    entry, doc = interp_entry(PREFILL)
    lens = [5, 2]
    x, w, pool = make(sum(lens), 8192, seed=6, n_slots=4)
    payloads = torch.tensor([0x7FA1, -0x003F, 0x7F81, -0x0001], dtype=torch.int16).view(torch.bfloat16)
    x[4, 100:104] = payloads  # the last input of sequence 0: it enters the state bitwise
    pool[3, 200:204, 2] = payloads  # sequence 1 (2 tokens) keeps its old state's last element
    x[0, :7] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 3e38, -3e38]).bfloat16()
    check_prefill(entry, doc, x, w, pool, [1, 3], lens)


def test_prefill_then_decode_is_one_sequence(interp_entry) -> None:
    """A prompt prefilled in two chunks then one decode step gives what the token-by-token reference gives."""
    entry, doc = interp_entry(PREFILL)
    upd, udoc = interp_entry(CONTRACT)
    x, w, pool = make(12, 600, seed=8, n_slots=3)
    mine, ref = pool.clone(), pool.clone()
    y1 = entry(doc["launch"], x=x[:7], weight=w, state_pool=mine, seq_slots=[2], q_lens=[7])
    y2 = entry(doc["launch"], x=x[7:11], weight=w, state_pool=mine, seq_slots=[2], q_lens=[4])
    y3 = upd(udoc["launch"], x=x[11:], weight=w, state_pool=mine, slots=torch.tensor([2]))
    y_ref, st = conv.causal_conv1d_ref(x, w, ref[2])
    got = torch.cat([y1, y2, y3])
    assert compare(doc["numerics"], got, y_ref)["ok"]
    assert bits_equal(mine[2], st)


def test_prefill_refuses_a_repeated_slot(interp_entry) -> None:
    entry, doc = interp_entry(PREFILL)
    x, w, pool = make(4, 600, seed=9)
    with pytest.raises(ValueError, match="twice"):
        entry(doc["launch"], x=x, weight=w, state_pool=pool, seq_slots=[3, 3], q_lens=[2, 2])
