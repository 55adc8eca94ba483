"""GDN prefill on CUDA through fla-core's chunk_gated_delta_rule (`gdn.gdn_prefill_fla`) against the
FP32 PyTorch reference (`gdn.gdn_prefill_ref`): outputs and the states written back to the pool, over
variable-length sequences that continue from non-zero states, with the pool's other slots (the pad
slot 0 among them) untouched; the gating inside fla's kernels (`gdn.gdn_prefill_gated`, raw a and b in) against
the reference's gating and prefill; and the engine's dispatch of `gdn_prefill` to it."""

from __future__ import annotations

import time

import pytest
import torch

from netra.ops import gdn

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")


def _inputs(lens: list[int], hk: int, hv: int, dk: int, dv: int, slots: int, seed: int
            ) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    t = sum(lens)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    q, k = r(t, hk, dk).to(CUDA, torch.bfloat16), r(t, hk, dk).to(CUDA, torch.bfloat16)
    v = r(t, hv, dv).to(CUDA, torch.bfloat16)
    a, b = r(t, hv).to(CUDA, torch.bfloat16), r(t, hv).to(CUDA, torch.bfloat16)
    a_log, dt_bias = (0.5 * r(hv)).to(CUDA), (0.5 * r(hv)).to(CUDA)
    g, beta = gdn.gdn_gating_ref(a, b, a_log, dt_bias)
    pool = (0.1 * r(slots, hv, dk, dv)).to(CUDA)  # sequences continue from non-zero states
    RAW[id(g)] = (a, b, a_log, dt_bias)
    return q, k, v, g, beta, pool


RAW: dict[int, tuple[torch.Tensor, ...]] = {}  # g's id -> the raw a, b, a_log, dt_bias it was made from


@pytest.mark.parametrize("shape", [(2, 4, 32, 32), (16, 32, 128, 128)], ids=["tiny", "qwen36"])
def test_fla_gating_in_kernel_matches_the_reference(shape: tuple[int, int, int, int]) -> None:
    """The engine's prefill call: raw a (bf16, a column view of the b|a projection as the engine holds it) and b in,
    fla's in-kernel gate and beta sigmoid, against `gdn_gating_ref` + `gdn_prefill_ref`; beside the two-op fla path;
    no host synchronisation."""
    hk, hv, dk, dv = shape
    lens, seq_slots = [1, 63, 64, 65, 200, 7], [5, 2, 7, 1, 3, 6]
    q, k, v, g, beta, pool = _inputs(lens, hk, hv, dk, dv, 8, seed=hv + 1)
    a, b, a_log, dt_bias = RAW[id(g)]
    ba = torch.cat([b, a], dim=1)  # the projection's [T, 2 Hv] output, split into strided column views
    b_view, a_view = ba[:, :hv], ba[:, hv:]
    ref_pool, fla_pool, two_pool = pool.clone(), pool.clone(), pool.clone()
    o_ref = gdn.gdn_prefill_ref(q, k, v, g, beta, ref_pool, seq_slots, lens)
    o_two = gdn.gdn_prefill_fla(q, k, v, g, beta, two_pool, seq_slots, lens)
    o = gdn.gdn_prefill_gated(q, k, v, a_view, b_view, a_log, dt_bias, fla_pool, seq_slots, lens)
    atol, rtol = gdn.FLA_TOLERANCE
    torch.testing.assert_close(o.float(), o_ref.float(), atol=atol, rtol=rtol)
    torch.testing.assert_close(fla_pool, ref_pool, atol=atol, rtol=rtol)
    print(f"{shape}: in-kernel gating vs two-op fla: max |do| {(o.float() - o_two.float()).abs().max().item():.2e}, "
          f"max |dstate| {(fla_pool - two_pool).abs().max().item():.2e}")
    for untouched in (0, 4):
        assert torch.equal(fla_pool[untouched], pool[untouched])
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        gdn.gdn_prefill_gated(q, k, v, a_view, b_view, a_log, dt_bias, fla_pool, seq_slots, lens)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("shape", [(2, 4, 32, 32), (16, 32, 128, 128)], ids=["tiny", "qwen36"])
def test_fla_prefill_matches_the_reference_varlen(shape: tuple[int, int, int, int]) -> None:
    hk, hv, dk, dv = shape
    lens = [1, 63, 64, 65, 200, 7]  # chunk edges (fla's chunks are 64 tokens), one token, a long one
    seq_slots = [5, 2, 7, 1, 3, 6]  # not in order; slots 0 (pad) and 4 belong to nobody
    q, k, v, g, beta, pool = _inputs(lens, hk, hv, dk, dv, 8, seed=hv)
    ref_pool, fla_pool = pool.clone(), pool.clone()
    o_ref = gdn.gdn_prefill_ref(q, k, v, g, beta, ref_pool, seq_slots, lens)
    o_fla = gdn.gdn_prefill_fla(q, k, v, g, beta, fla_pool, seq_slots, lens)
    assert o_fla.shape == o_ref.shape and o_fla.dtype == o_ref.dtype == torch.bfloat16
    atol, rtol = gdn.FLA_TOLERANCE
    do = (o_fla.float() - o_ref.float()).abs().max().item()
    ds = (fla_pool - ref_pool).abs().max().item()
    print(f"{shape}: max |do| {do:.2e} (|o| max {o_ref.float().abs().max().item():.2f}), max |dstate| {ds:.2e}")
    torch.testing.assert_close(o_fla.float(), o_ref.float(), atol=atol, rtol=rtol)
    torch.testing.assert_close(fla_pool, ref_pool, atol=atol, rtol=rtol)
    for untouched in (0, 4):
        assert torch.equal(fla_pool[untouched], pool[untouched])


def test_gdn_prefill_dispatches_to_fla_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    lens, seq_slots = [1000, 24], [1, 2]
    q, k, v, g, beta, pool = _inputs(lens, 16, 32, 128, 128, 3, seed=1)
    got = {}
    for how in ("reference", "fla"):
        monkeypatch.setenv("NETRA_GDN_PREFILL", how)
        p = pool.clone()
        gdn.gdn_prefill(q, k, v, g, beta, p, seq_slots, lens)  # warm-up (fla: Triton compiles)
        p = pool.clone()
        torch.cuda.synchronize()
        t = time.perf_counter()
        o = gdn.gdn_prefill(q, k, v, g, beta, p, seq_slots, lens)
        torch.cuda.synchronize()
        print(f"gdn_prefill {how}: 1,024 tokens, 32 value heads of 128: {1e3 * (time.perf_counter() - t):.2f} ms")
        got[how] = (o, p)
    assert torch.equal(got["fla"][0], gdn.gdn_prefill_fla(q, k, v, g, beta, pool.clone(), seq_slots, lens))
    atol, rtol = gdn.FLA_TOLERANCE
    torch.testing.assert_close(got["fla"][0].float(), got["reference"][0].float(), atol=atol, rtol=rtol)
    monkeypatch.setenv("NETRA_GDN_PREFILL", "triton")
    with pytest.raises(ValueError, match="NETRA_GDN_PREFILL"):
        gdn.gdn_prefill(q, k, v, g, beta, pool.clone(), seq_slots, lens)


def test_fla_prefill_makes_no_host_synchronisation() -> None:
    """The chunk indices fla needs come from the host lists (fla's own builds them on the host and copies them from
    pageable memory: a stream synchronisation per GDN layer); they are fla's own."""
    from fla.ops.utils.index import prepare_chunk_indices

    lens, seq_slots = [1, 63, 64, 65, 200, 7], [5, 2, 7, 1, 3, 6]
    q, k, v, g, beta, pool = _inputs(lens, 16, 32, 128, 128, 8, seed=3)
    gdn.gdn_prefill_fla(q, k, v, g, beta, pool, seq_slots, lens)  # compiles, caches the index tensors
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        gdn.gdn_prefill_fla(q, k, v, g, beta, pool, seq_slots, lens)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    offsets = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device=CUDA)
    assert torch.equal(gdn.fla_chunk_indices(tuple(lens), CUDA), prepare_chunk_indices(offsets, gdn.FLA_CHUNK))
