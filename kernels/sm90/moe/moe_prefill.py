"""The MoE block at prefill token counts (129..8192 tokens per chunk) on sm90, in Triton: op ``moe_fp8_block``,
contract ``moe_block_prefill``; the oracle is netra/ops/moe.py ``moe_ref`` (numerics in netra/ops/moe_fp8.py).

Pipeline (eager only: prefill is never captured; no host synchronisation, no ``.item()``):

1. `_router_kernel`: BF16 logits ``[T, E + 1]`` = bf16(x . [router; shared_gate]ᵀ), FP32 accumulation (column E is
   the shared expert's gate logit).
2. Routing and sort/align in four small kernels (`route_align`; no host synchronisation, four launches where about
   45 torch ops per layer ran before, with their host cost and device sorts: measured in
   results/serving/dp1-h200-20261202-prefill/prefill_profile.json, see results/sm90/NOTES.md):
   `_topk_kernel`: per 8 tokens the oracle's selection (the top k logits, ties to the lowest expert: the order of
   a stable descending sort), FP32 softmax over all experts gathered at the k ids and renormalised, the shared
   expert as route k (expert id E, weight sigmoid(bf16 gate logit)), and the block's count of routes per expert;
   `_block_offsets_kernel`: per expert, each block's first position among that expert's routes, and the totals;
   `_tile_table_kernel`: the experts' segments (exclusive scan of the counts) and the tile table of
   ``MAXT = cdiv(T * (k + 1), BLOCK_M) + E + 1`` entries (an upper bound of sum_e cdiv(count_e, BLOCK_M)): per
   tile its expert (-1: empty), first sorted row and row count; `_scatter_kernel`: each route's sorted row, its
   rank among the earlier routes of its expert: bitwise the order of a stable argsort of the ``T * (k + 1)`` ids.
3. x per token in groups of 128 -> E4M3 + FP32 scales (IEEE divisions, netra/ops/fp8.py), by the router kernel's
   first column block (one launch less).
4. `_gate_up_kernel`, grid (N_I / 128, MAXT): one (expert, BLOCK_M rows, 128 columns of gate and the same 128 of up)
   tile; gathers its rows' quantized x, accumulates E4M3 dots in FP32 per 128-wide K block scaled by
   token-group x weight-block scale, in K order; gate and up rounded to BF16, SiLU(gate) * up in FP32 rounded to
   BF16, re-quantized per group of 128 (the tile's 128 columns are one group) -> hq E4M3 / hs FP32 at the sorted
   row. Expert E reads the shared expert's own tensors (no stacked copy).
5. `_down_kernel`, grid (H / BLOCK_N, MAXT): the same tiles against w2; y[route] = bf16(acc * route weight), one
   BF16 row per route in route order (``[T * (k + 1), H]``).
6. `_combine_kernel`: out[t] = bf16(sum of the k + 1 routes of t in FP32 in rank order, shared last).

Byte floor: at 1K..8K tokens every one of the 256 experts is hit, so the routed weights are read at least once:
256 x (2 MB w13 + 1 MB w2) + scales = 805 MB; plus x in, y out (the route rows are written and read once: 9 x 4 KB per
token, 74 KB/token in all with hq). FP8 tensor work: 9 routes x 3 x 2 x 2048 x 512 flop per token = 56.6 MFLOP/token.
The floors in time, the prediction made before any H200 run of this source (against SGLang 0.5.23's block, the same
W8A8 tile design) and the records: results/sm90/NOTES.md.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

GROUP = 128


@triton.jit
def _router_kernel(x_ptr, wr_ptr, wg_ptr, out_ptr, xq_ptr, xs_ptr, T, E, H, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """logits[t, n] = bf16(sum_k x[t, k] * w[n, k]) in FP32, w = router rows (n < E) and the shared gate (n == E);
    the first column block's programs also quantize their rows of x per group of 128 (xq E4M3, xs FP32)."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < T
    n_mask = offs_n <= E
    w_rows = tl.where(offs_n < E, wr_ptr + offs_n * H, wg_ptr)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        a = tl.load(x_ptr + offs_m[:, None] * H + (k0 + offs_k)[None, :], mask=m_mask[:, None], other=0.0)
        w = tl.load(w_rows[None, :] + (k0 + offs_k)[:, None], mask=n_mask[None, :], other=0.0)
        acc += tl.dot(a, w, out_dtype=tl.float32)
    tl.store(out_ptr + offs_m[:, None] * (E + 1) + offs_n[None, :], acc.to(tl.bfloat16),
             mask=m_mask[:, None] & n_mask[None, :])
    if pid_n == 0:  # x per token in groups of 128 -> E4M3 + FP32 scales, 16 rows x 128 at a time (ptxas at an
        # 8,192-token chunk's specialization: 80 registers, against 110 for the whole 64-row tile; no spills either way)
        offs_g = tl.arange(0, 128)
        for r0 in tl.static_range(0, BLOCK_M, 16):
            rows = pid_m * BLOCK_M + r0 + tl.arange(0, 16)
            r_mask = rows < T
            for g0 in range(0, H, 128):
                xg = tl.load(x_ptr + rows[:, None] * H + (g0 + offs_g)[None, :], mask=r_mask[:, None],
                             other=0.0).to(tl.float32)
                q, sg = _quant_groups(xg)
                tl.store(xq_ptr + rows[:, None] * H + (g0 + offs_g)[None, :], q, mask=r_mask[:, None])
                tl.store(xs_ptr + rows * (H // 128) + g0 // 128, sg, mask=r_mask)


@triton.jit
def _quant_groups(x):
    """Rows of FP32 values, one group of 128 per row -> (E4M3 values, FP32 scales): amax, scale = max(amax, 1e-10) /
    448 and q = e4m3(clamp(x / scale)) with IEEE divisions (netra/ops/fp8.py)."""
    s = tl.math.div_rn(tl.maximum(tl.max(tl.abs(x), axis=1), 1e-10), 448.0)
    return tl.clamp(tl.math.div_rn(x, s[:, None]), -448.0, 448.0).to(tl.float8e4nv), s


@triton.jit
def _tile(t_exp_ptr, t_row_ptr, t_cnt_ptr, pid_t, BLOCK_M: tl.constexpr):
    """A tile-table entry: (expert, or -1 for an unused entry; its sorted-route rows; their mask)."""
    e = tl.load(t_exp_ptr + pid_t)
    row0 = tl.load(t_row_ptr + pid_t)
    cnt = tl.load(t_cnt_ptr + pid_t)
    offs_m = tl.arange(0, BLOCK_M)
    return e, row0 + offs_m, offs_m < cnt


@triton.jit
def _gate_up_kernel(xq_ptr, xs_ptr, tok_ptr, t_exp_ptr, t_row_ptr, t_cnt_ptr, w13_ptr, s13_ptr, sw13_ptr, ss13_ptr,
                    hq_ptr, hs_ptr, E, H, N_I, BLOCK_M: tl.constexpr):
    """One tile: h[rows, 128 cols] = quant(bf16(silu(bf16(gate)) * bf16(up))) for the tile's expert."""
    BLOCK_K: tl.constexpr = 128
    pid_n = tl.program_id(0)
    pid_t = tl.program_id(1)
    e, rows, m_mask = _tile(t_exp_ptr, t_row_ptr, t_cnt_ptr, pid_t, BLOCK_M)
    if e >= 0:
        tok = tl.load(tok_ptr + rows, mask=m_mask, other=0)
        nkb = H // BLOCK_K
        if e == E:
            w_base = sw13_ptr
            s_base = ss13_ptr
        else:
            w_base = w13_ptr + e.to(tl.int64) * (2 * N_I * H)
            s_base = s13_ptr + e * ((2 * N_I // BLOCK_K) * nkb)
        offs_n = pid_n * 128 + tl.arange(0, 128)
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = xq_ptr + tok[:, None].to(tl.int64) * H + offs_k[None, :]
        sa_ptrs = xs_ptr + tok * nkb
        g_ptrs = w_base + offs_n[:, None] * H + offs_k[None, :]
        u_ptrs = g_ptrs + N_I * H
        sg_ptr = s_base + pid_n * nkb
        su_ptr = s_base + (N_I // BLOCK_K + pid_n) * nkb
        acc_g = tl.zeros([BLOCK_M, 128], dtype=tl.float32)
        acc_u = tl.zeros([BLOCK_M, 128], dtype=tl.float32)
        for kb in range(0, nkb):
            a = tl.load(a_ptrs + kb * BLOCK_K, mask=m_mask[:, None], other=0.0)
            sa = tl.load(sa_ptrs + kb, mask=m_mask, other=0.0)
            wg = tl.load(g_ptrs + kb * BLOCK_K)
            wu = tl.load(u_ptrs + kb * BLOCK_K)
            sg = tl.load(sg_ptr + kb)
            su = tl.load(su_ptr + kb)
            acc_g += tl.dot(a, tl.trans(wg), out_dtype=tl.float32) * (sa[:, None] * sg)
            acc_u += tl.dot(a, tl.trans(wu), out_dtype=tl.float32) * (sa[:, None] * su)
        g = acc_g.to(tl.bfloat16).to(tl.float32)
        u = acc_u.to(tl.bfloat16).to(tl.float32)
        h = (g / (1.0 + tl.exp(-g)) * u).to(tl.bfloat16).to(tl.float32)
        q, sh = _quant_groups(h)
        tl.store(hq_ptr + rows[:, None].to(tl.int64) * N_I + offs_n[None, :], q, mask=m_mask[:, None])
        tl.store(hs_ptr + rows * (N_I // BLOCK_K) + pid_n, sh, mask=m_mask)


@triton.jit
def _down_kernel(hq_ptr, hs_ptr, route_ptr, rw_ptr, t_exp_ptr, t_row_ptr, t_cnt_ptr, w2_ptr, s2_ptr, sw2_ptr, ss2_ptr,
                 y_ptr, E, H, N_I, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One tile: y[route, cols] = bf16((hq . w2ᵀ) * route weight) for the tile's expert and rows."""
    BLOCK_K: tl.constexpr = 128
    pid_n = tl.program_id(0)
    pid_t = tl.program_id(1)
    e, rows, m_mask = _tile(t_exp_ptr, t_row_ptr, t_cnt_ptr, pid_t, BLOCK_M)
    if e >= 0:
        rte = tl.load(route_ptr + rows, mask=m_mask, other=0)
        rw = tl.load(rw_ptr + rte, mask=m_mask, other=0.0)
        nkb = N_I // BLOCK_K
        if e == E:
            w_base = sw2_ptr
            s_base = ss2_ptr
        else:
            w_base = w2_ptr + e.to(tl.int64) * (H * N_I)
            s_base = s2_ptr + e * ((H // BLOCK_K) * nkb)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = hq_ptr + rows[:, None].to(tl.int64) * N_I + offs_k[None, :]
        sa_ptrs = hs_ptr + rows * nkb
        w_ptrs = w_base + offs_n[:, None] * N_I + offs_k[None, :]
        sw_ptrs = s_base + (offs_n // BLOCK_K) * nkb
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for kb in range(0, nkb):
            a = tl.load(a_ptrs + kb * BLOCK_K, mask=m_mask[:, None], other=0.0)
            sa = tl.load(sa_ptrs + kb, mask=m_mask, other=0.0)
            w = tl.load(w_ptrs + kb * BLOCK_K)
            sw = tl.load(sw_ptrs + kb)
            acc += tl.dot(a, tl.trans(w), out_dtype=tl.float32) * (sa[:, None] * sw[None, :])
        y = (acc * rw[:, None]).to(tl.bfloat16)
        tl.store(y_ptr + rte[:, None].to(tl.int64) * H + offs_n[None, :], y, mask=m_mask[:, None])


@triton.jit
def _combine_kernel(y_ptr, out_ptr, H, S: tl.constexpr, BLOCK: tl.constexpr):
    """out[t, cols] = bf16(y[t, 0] + y[t, 1] + ... + y[t, S - 1]) in FP32, in route order."""
    t = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < H
    base = y_ptr + t.to(tl.int64) * S * H + offs
    acc = tl.load(base, mask=mask, other=0.0).to(tl.float32)
    for s in tl.static_range(1, S):
        acc += tl.load(base + s * H, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + t.to(tl.int64) * H + offs, acc.to(tl.bfloat16), mask=mask)


@triton.jit
def _topk_kernel(logits_ptr, ids_ptr, rw_ptr, hist_ptr, T, E: tl.constexpr, K: tl.constexpr, EP: tl.constexpr,
                 SP: tl.constexpr, BT: tl.constexpr, RENORM: tl.constexpr):
    """BT tokens' routes: ids [T, K + 1] int32 and weights rw [T, K + 1] FP32 from the logits [T, E + 1] (column E the
    shared gate's), and hist[block, e] = this block's routes per expert e <= E (the spare bin EP - 1 > E takes the
    padding)."""
    S: tl.constexpr = K + 1
    pid = tl.program_id(0)
    t = pid * BT + tl.arange(0, BT)
    tm = t < T
    e = tl.arange(0, EP)
    lg = tl.load(logits_ptr + t[:, None] * (E + 1) + e[None, :], mask=tm[:, None] & (e[None, :] < E),
                 other=0.0).to(tl.float32)
    lg = tl.where(e[None, :] < E, lg, float("-inf"))
    gate = tl.load(logits_ptr + t * (E + 1) + E, mask=tm, other=0.0).to(tl.float32)
    mx = tl.max(lg, axis=1)
    den = tl.sum(tl.exp(lg - mx[:, None]), axis=1)
    s = tl.arange(0, SP)
    ids = tl.full([BT, SP], E, tl.int32)
    w = tl.zeros([BT, SP], dtype=tl.float32)
    work = lg
    for j in tl.static_range(K):  # the largest remaining logit, the lowest expert among equals
        m = tl.max(work, axis=1)
        idx = tl.min(tl.where(work == m[:, None], e[None, :], EP), axis=1)
        ids = tl.where(s[None, :] == j, idx[:, None], ids)
        w = tl.where(s[None, :] == j, tl.math.div_rn(tl.exp(m - mx), den)[:, None], w)
        work = tl.where(e[None, :] == idx[:, None], float("-inf"), work)
    if RENORM:
        w = tl.math.div_rn(w, tl.sum(tl.where(s[None, :] < K, w, 0.0), axis=1)[:, None])
    w = tl.where(s[None, :] == K, tl.math.div_rn(1.0, 1.0 + tl.exp(-gate))[:, None], w)
    valid = tm[:, None] & (s[None, :] < S)
    off = t[:, None] * S + s[None, :]
    tl.store(ids_ptr + off, ids, mask=valid)
    tl.store(rw_ptr + off, w, mask=valid)
    h = tl.histogram(tl.reshape(tl.where(valid, ids, EP - 1), [BT * SP]), EP)
    tl.store(hist_ptr + pid * (E + 1) + e, h, mask=e < E + 1)


@triton.jit
def _block_offsets_kernel(hist_ptr, base_ptr, counts_ptr, NB, E1, BB: tl.constexpr, BE: tl.constexpr):
    """Per expert e (BE of them a program): base[b, e] = routes of e in blocks before b; counts[e] = all of them."""
    e = tl.program_id(0) * BE + tl.arange(0, BE)
    em = e < E1
    carry = tl.zeros([BE], dtype=tl.int32)
    for b0 in range(0, NB, BB):
        b = b0 + tl.arange(0, BB)
        mask = (b < NB)[:, None] & em[None, :]
        h = tl.load(hist_ptr + b[:, None] * E1 + e[None, :], mask=mask, other=0)
        tl.store(base_ptr + b[:, None] * E1 + e[None, :], carry[None, :] + tl.cumsum(h, axis=0) - h, mask=mask)
        carry += tl.sum(h, axis=0)
    tl.store(counts_ptr + e, carry, mask=em)


@triton.jit
def _tile_table_kernel(counts_ptr, seg_ptr, t_exp_ptr, t_row_ptr, t_cnt_ptr, max_tiles, E1, EP: tl.constexpr,
                       BM: tl.constexpr, BJ: tl.constexpr):
    """BJ tile-table entries: the expert whose tiles hold entry j (-1 past the last), its first sorted row, its row
    count; program 0 also stores each expert's first sorted row (seg)."""
    e = tl.arange(0, EP)
    em = e < E1
    c = tl.load(counts_ptr + e, mask=em, other=0)
    seg = tl.cumsum(c, axis=0) - c
    tiles = (c + BM - 1) // BM
    cum = tl.cumsum(tiles, axis=0)
    if tl.program_id(0) == 0:
        tl.store(seg_ptr + e, seg, mask=em)
    j = tl.program_id(0) * BJ + tl.arange(0, BJ)
    e_of = tl.sum(((cum[None, :] <= j[:, None]) & em[None, :]).to(tl.int32), axis=1)  # searchsorted(cum, j, right)
    e_c = tl.minimum(e_of, E1 - 1)
    local = j - tl.gather(cum - tiles, e_c, 0)
    row0 = tl.gather(seg, e_c, 0) + local * BM
    cnt = tl.minimum(tl.maximum(tl.gather(c, e_c, 0) - local * BM, 0), BM)
    jm = j < max_tiles
    tl.store(t_exp_ptr + j, tl.where(e_of < E1, e_c, -1), mask=jm)
    tl.store(t_row_ptr + j, row0, mask=jm)
    tl.store(t_cnt_ptr + j, cnt, mask=jm)


@triton.jit
def _scatter_kernel(ids_ptr, base_ptr, seg_ptr, order_ptr, tok_ptr, T, E1, S: tl.constexpr, SP: tl.constexpr,
                    BT: tl.constexpr):
    """A block's routes to their sorted rows: an expert's segment start, the block's offset in it, and the route's
    rank among the block's earlier routes of that expert (flat route order: a stable sort)."""
    pid = tl.program_id(0)
    r = tl.arange(0, BT * SP)
    t = pid * BT + r // SP
    s = r % SP
    valid = (t < T) & (s < S)
    e = tl.load(ids_ptr + t * S + s, mask=valid, other=-1)
    earlier = (e[:, None] == e[None, :]) & (r[None, :] < r[:, None]) & valid[None, :]
    rank = tl.sum(earlier.to(tl.int32), axis=1)
    pos = tl.load(seg_ptr + e, mask=valid, other=0) + tl.load(base_ptr + pid * E1 + e, mask=valid, other=0) + rank
    tl.store(order_ptr + pos, t * S + s, mask=valid)
    tl.store(tok_ptr + pos, t, mask=valid)


ROUTE_TOKENS = 8  # tokens per program of the route and scatter kernels (their [8 x 16]^2 rank compare)


def route_align(logits: torch.Tensor, experts: int, top_k: int, renormalize: bool, block_m: int, max_tiles: int
                ) -> tuple[torch.Tensor, ...]:
    """Routing and sort/align of the BF16 logits ``[T, E + 1]`` (column E the shared gate's) on the device:
    (route weights FP32 ``[T * (k + 1)]``, sorted row -> route int32 ``[T * (k + 1)]``, sorted row -> token int32,
    and per tile of ``block_m`` sorted rows of one expert: expert (-1 past the last tile), first sorted row, row
    count, int32 ``[max_tiles]`` each)."""
    t, dev = logits.shape[0], logits.device
    e1, s = experts + 1, top_k + 1
    ep = triton.next_power_of_2(experts + 2)  # the bins 0..E and a spare one for the padding
    sp = triton.next_power_of_2(s)
    nb = triton.cdiv(t, ROUTE_TOKENS)
    i32 = torch.int32
    ids = torch.empty(t, s, dtype=i32, device=dev)
    rw = torch.empty(t * s, dtype=torch.float32, device=dev)
    hist = torch.empty(nb, e1, dtype=i32, device=dev)
    _topk_kernel[(nb,)](logits, ids, rw, hist, t, E=experts, K=top_k, EP=ep, SP=sp, BT=ROUTE_TOKENS,
                        RENORM=bool(renormalize), num_warps=4)
    base = torch.empty(nb, e1, dtype=i32, device=dev)
    counts = torch.empty(e1, dtype=i32, device=dev)
    _block_offsets_kernel[(triton.cdiv(e1, 64),)](hist, base, counts, nb, e1, BB=64, BE=64, num_warps=4)
    seg = torch.empty(e1, dtype=i32, device=dev)
    t_exp, t_row, t_cnt = (torch.empty(max_tiles, dtype=i32, device=dev) for _ in range(3))
    _tile_table_kernel[(triton.cdiv(max_tiles, 32),)](counts, seg, t_exp, t_row, t_cnt, max_tiles, e1, EP=ep,
                                                      BM=block_m, BJ=32, num_warps=4)
    order = torch.empty(t * s, dtype=i32, device=dev)
    tok = torch.empty(t * s, dtype=i32, device=dev)
    _scatter_kernel[(nb,)](ids, base, seg, order, tok, t, e1, S=s, SP=sp, BT=ROUTE_TOKENS, num_warps=4)
    return rw, order, tok, t_exp, t_row, t_cnt


def moe_prefill(launch: dict[str, Any], *, x: torch.Tensor, weights: Any) -> torch.Tensor:
    """Op ``moe_fp8_block`` (the whole block) for a prefill chunk: ``x [T, H]`` BF16, ``weights`` a
    `netra.ops.moe.MoEWeights` (E4M3 experts with 128 x 128 block scales) -> a new ``[T, H]`` BF16."""
    from netra.runtime import grid_size

    w = weights
    meta = launch["meta"]
    bm, bn, warps, stages = int(meta["BLOCK_M"]), int(meta["BLOCK_N"]), int(meta["num_warps"]), int(meta["num_stages"])
    t, h = x.shape
    e, k = w.num_experts, w.top_k
    inter = w.w2.data.shape[-1]
    s = k + 1
    if h % GROUP or inter % GROUP or h % bn or w.shared_w2.data.shape[-1] != inter:
        raise ValueError(f"moe_prefill: hidden {h} / inter {inter} / shared inter {w.shared_w2.data.shape[-1]} must be "
                         f"multiples of {GROUP} (and of BLOCK_N {bn}) with the shared expert as wide as the routed ones")
    dev = x.device
    x = x.contiguous()
    # 1. router + shared-gate logits, and x quantized once per token (3.)
    nkb = h // GROUP
    logits = torch.empty(t, e + 1, dtype=torch.bfloat16, device=dev)
    xq = torch.empty(t, h, dtype=torch.float8_e4m3fn, device=dev)
    xs = torch.empty(t, nkb, dtype=torch.float32, device=dev)
    _router_kernel[(triton.cdiv(e + 1, 64), triton.cdiv(t, 64))](
        x, w.router.data, w.shared_gate.data, logits, xq, xs, t, e, h, BLOCK_M=64, BLOCK_N=64, BLOCK_K=64,
        num_warps=4)
    # 2. top-k (the oracle's rule), the shared expert as route k, sort/align
    max_tiles = grid_size(launch["grid"], {"tokens": t, "experts": e, "top_k": k, **meta})[0]
    rw, order, tok, t_exp, t_row, t_cnt = route_align(logits, e, k, w.renormalize, bm, max_tiles)
    # 4. gate_up + SiLU*up + re-quantization, per (128 columns, tile)
    hq = torch.empty(t * s, inter, dtype=torch.float8_e4m3fn, device=dev)
    hs = torch.empty(t * s, inter // GROUP, dtype=torch.float32, device=dev)
    _gate_up_kernel[(inter // GROUP, max_tiles)](
        xq, xs, tok, t_exp, t_row, t_cnt, w.w13.data, w.w13.scale_inv, w.shared_w13.data, w.shared_w13.scale_inv,
        hq, hs, e, h, inter, BLOCK_M=bm, num_warps=warps, num_stages=stages)
    # 5. down GEMM, each route's row scaled by its weight and rounded to BF16
    y = torch.empty(t * s, h, dtype=torch.bfloat16, device=dev)
    _down_kernel[(h // bn, max_tiles)](
        hq, hs, order, rw, t_exp, t_row, t_cnt, w.w2.data, w.w2.scale_inv, w.shared_w2.data, w.shared_w2.scale_inv,
        y, e, h, inter, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages)
    # 6. the routes summed in rank order
    out = torch.empty(t, h, dtype=torch.bfloat16, device=dev)
    _combine_kernel[(t, triton.cdiv(h, 1024))](y, out, h, S=s, BLOCK=1024, num_warps=4)
    return out
