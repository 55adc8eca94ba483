// moe_layer_t1: the routed MoE layer (256 experts, top-8, FP8 block-scaled, width 512) for ONE token in one cooperative
// kernel. Contracts moe_routed_t1 (routed experts from given top-8 ids and weights) and moe_block_t1 (moe_route -> this,
// the shared expert as a 9th route: moe_route computed its h, this kernel runs its down GEMM beside the 8 others).
//
// Grid = 128 CTAs (one per SM, cooperative), 384 threads (8 MMA warps + 4 chain warps), ~208 KB of dynamic shared
// memory; launched with programmatic dependent launch: every thread waits for the previous kernel at entry, then
// triggers its dependents (the next block's route step requests its weights early). CTA c: route kq = c / 16, h columns
// [32 j, 32 j + 32) with j = c % 16 (gate rows 32 j.., up rows 512 + 32 j..); down: output rows [16 c, 16 c + 16) of
// all 8 experts.
//   * every CTA's weights are requested at entry (L2 evict_first: read once), x is read by the MMA warps before any
//     copy is issued and the weight scales arrive by TMA ahead of their tiles, so no operand load waits behind the
//     stream; the down share's copies wait until gate_up tile 2 has landed;
//   * gate_up tile = 8 gate + 8 up rows of the same 8 columns, so the CTA computes h = bf16(SiLU(bf16 gate) * bf16 up)
//     itself; 8 MMA warps work on every tile as it lands (warp w: K blocks 2w, 2w + 1) and park the raw fragments in
//     the tile's shared memory; a chain warp per tile then runs the tile's scaled FP32 chain over K blocks 0..15 in
//     order (one warp's arithmetic, so the numerics match the reference's K order);
//   * no grid barrier: each route has an arrival counter that only grows (16 per launch, red.release); MMA warp k
//     waits for route k's 16 CTAs only (the count to wait for comes from a launch counter read at entry), quantizes
//     h_k (moe::quant8_halfwarp) and runs route k's down tile; the top-k sum is local to the CTA;
//   * the shared expert (when sw2 is non-null, moe_block_t1): its h (sh_h, from moe_route, complete at entry) needs no
//     arrival; chain warp 0, idle once its gate_up tile is done, quantizes it and runs the down tile of rows
//     [16 c, 16 c + 16) of the shared w2 (one more 8 KB tile in the down share) with weight topk_w[8] (the sigmoid
//     gate), as route 8: the nine routes are summed in FP32 in rank order (shared last) and rounded once, the oracle's
//     order (netra/ops/moe.py moe_ref).
// Numerics (netra/ops/moe_fp8.py moe_routed_ref): x quantized per group of 128 (IEEE divisions, RNE), the swapped-
// operand mma.sync m16n8k32 e4m3 core with per-K-block FP32 scaling in K order, gate / up rounded to BF16 before SiLU,
// h quantized per 128, y = bf16(acc * w_k), the 8 routes summed in rank order in FP32 and rounded once.
// Params: `gu` holds h: [8, 512] BF16, route order (experts by increasing id). dbg_hq / dbg_hs: CTA 0's copy of h_q /
// h_s when non-null (tests). Workspace (zeroed once, only grows): words 0..7 = the routes' arrival counts (16 per
// launch each), word 8 = the launch counter (128 per launch). One stream at a time per device. History: docs/moe.md.
#include "moe_common.cuh"
#include "moe_sync.cuh"
#include <stddef.h>
constexpr int M1F_W2_AFTER = 2;  // the down share is requested once gate_up tile 2 has landed
#define HID 2048
#define INTER 512
#define TOPK 8
#define NR (TOPK + 1)                  // route slots in shared memory: 8 routed + the shared expert
#define F_CTAS 128
#define F_THREADS 384
#define F_MMA_WARPS 8                  // gate_up MMAs, x / h quantization, down
#define F_MMA_THREADS (32 * F_MMA_WARPS)
#define GU_TILE_BYTES 32768            // 8 gate rows + 8 up rows x 2048 B
#define GU_HALF_BYTES 16384
#define DN_TILE_BYTES 8192             // 16 rows x 512 B
#define HROW 528                       // h row stride in shared memory (as moe_m1.cu)
// dynamic shared memory layout
#define OFF_GU 0                                      // 4 tiles
#define OFF_DN (OFF_GU + 4 * GU_TILE_BYTES)           // 131072: 9 x 8 KB
#define OFF_SC (OFF_DN + NR * DN_TILE_BYTES)          // 204800: w13 scales gate [16] | up [16], w2 scales [9][4]
#define SC_BYTES (32 * 4 + NR * 16)                   // 272
#define OFF_XQ (OFF_SC + SC_BYTES)                    // 205072: x_q [2048] E4M3
#define OFF_XS (OFF_XQ + HID)                         // 207120: x_s [16] FP32
#define D_BYTES (16 * 32 * 16)                        // raw fragments of a tile [16 kb][32 lanes][4]: in the tile's own
                                                      // first 8 KB once the MMA warps have read it
#define OFF_H (OFF_XS + 64)                           // 207184: h_q [9][HROW]
#define OFF_HS (OFF_H + NR * HROW)                    // 211936: h_s [9][4]
#define OFF_Y (OFF_HS + NR * 4 * 4)                   // 212080: y [9][16] FP32
#define OFF_BAR (OFF_Y + NR * 16 * 4)                 // 212656: 6 mbarriers
#define F_SMEM (OFF_BAR + 64)                         // 212720
static_assert(OFF_SC % 16 == 0 && OFF_XQ % 16 == 0 && OFF_H % 16 == 0 &&
              OFF_BAR % 8 == 0, "alignment");
static_assert(F_SMEM == 212720 && F_SMEM <= 232448, "shared memory (the contracts' smem_bytes)");

struct LayerT1Params {
  const __nv_bfloat16* x;    // [1, 2048]
  const int* topk_ids;       // [1, >= 8] int32, rank order, distinct (ids 0..7 are read)
  const float* topk_w;       // [1, 8] fp32 ([1, 9] with the shared expert: its gate weight last)
  const uint8_t* w13;        // [E(+1), 1024, 2048] e4m3
  const float* w13_scale;    // [E(+1), 8, 16]
  const uint8_t* w2;         // [E(+1), 2048, 512] e4m3
  const float* w2_scale;     // [E(+1), 16, 4]
  __nv_bfloat16* gu;         // h [8, 512] BF16 (route order, scratch)
  __nv_bfloat16* out;        // [1, 2048]
  unsigned* bar;             // workspace (zeroed once): see each kernel's header
  uint8_t* dbg_hq;           // [>= 8, 512] copy of h_q (route order) when non-null (tests; CTA 0 writes)
  float* dbg_hs;             // [>= 8, 4]
  const uint8_t* sw2;        // [2048, 512] e4m3: the shared expert's w2, or null (routed experts only)
  const float* sw2_scale;    // [16, 4]
  const __nv_bfloat16* sh_h; // [512] BF16: the shared expert's h (moe_route), with sw2
};

extern "C" __device__ unsigned int netra_params_layout[] = {
    sizeof(LayerT1Params), offsetof(LayerT1Params, x), offsetof(LayerT1Params, topk_ids), offsetof(LayerT1Params, topk_w),
    offsetof(LayerT1Params, w13), offsetof(LayerT1Params, w13_scale), offsetof(LayerT1Params, w2), offsetof(LayerT1Params, w2_scale),
    offsetof(LayerT1Params, gu), offsetof(LayerT1Params, out), offsetof(LayerT1Params, bar), offsetof(LayerT1Params, dbg_hq),
    offsetof(LayerT1Params, dbg_hs), offsetof(LayerT1Params, sw2), offsetof(LayerT1Params, sw2_scale),
    offsetof(LayerT1Params, sh_h)};


namespace {

// The down share: the w2 scales and output rows [16c, 16c + 16) of w2 for each of the 8 experts (and of the shared
// expert, slot 8, when sw2 is given).
__device__ __forceinline__ void issue_down_share(const LayerT1Params& p, const int (&ids)[TOPK], uint8_t* smem, uint64_t* bar, int c) {
  const bool sh = p.sw2 != nullptr;
  mbar_expect_tx(bar, (TOPK + (sh ? 1 : 0)) * (DN_TILE_BYTES + 16));
  const uint64_t wpol = l2_evict_first();
#pragma unroll
  for (int k = 0; k < TOPK; ++k)
    bulk_g2s(smem + OFF_SC + 128 + 16 * k, p.w2_scale + ((size_t)ids[k] * 16 + (c >> 3)) * 4, 16, bar);
  if (sh) bulk_g2s(smem + OFF_SC + 128 + 16 * TOPK, p.sw2_scale + (c >> 3) * 4, 16, bar);
#pragma unroll
  for (int k = 0; k < TOPK; ++k)
    bulk_g2s_hint(smem + OFF_DN + k * DN_TILE_BYTES, p.w2 + ((size_t)ids[k] * HID + c * 16) * INTER, DN_TILE_BYTES, bar, wpol);
  if (sh) bulk_g2s_hint(smem + OFF_DN + TOPK * DN_TILE_BYTES, p.sw2 + (size_t)c * 16 * INTER, DN_TILE_BYTES, bar, wpol);
}

// Route slot k's down tile by one warp: h_k (BF16, global: hsrc) quantized per 128 (half-warp hw takes 128-groups 2hw
// and 2hw + 1, 8 values per lane; st8's down prologue arithmetic without the SiLU), then output rows [16c, 16c + 16) of
// the slot's w2 tile (one 16-row tile, as one q tile of an st8 down item) with h_k in B column 0; y_k = bf16(acc * w_k).
// dbg_row >= 0: CTA 0's copy of h_q / h_s for tests.
__device__ __forceinline__ void down_route(const LayerT1Params& p, const __nv_bfloat16* hsrc, int k, int dbg_row,
                                           uint8_t* smem, uint64_t* full4, float w) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  const bool valid = g == 0;
  uint8_t* s_h = smem + OFF_H;
  float* s_hs = reinterpret_cast<float*>(smem + OFF_HS);
  float* s_y = reinterpret_cast<float*>(smem + OFF_Y);
  const float* s_w2s = reinterpret_cast<const float*>(smem + OFF_SC) + 32;  // [9 slots][4]
  const int hw = lane >> 4, sub = lane & 15;
  uint4 hv[2];
#pragma unroll
  for (int u = 0; u < 2; ++u) hv[u] = __ldcg(reinterpret_cast<const uint4*>(hsrc + (2 * hw + u) * 128 + sub * 8));
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    const int grp = 2 * hw + u, col = grp * 128 + sub * 8;
    float h[8];
    moe::bf16x8_to_float(hv[u], h);
    float sc;
    const uint2 q = moe::quant8_halfwarp(h, sc);
    *reinterpret_cast<uint2*>(s_h + k * HROW + col) = q;
    if (sub == 0) s_hs[k * 4 + grp] = sc;
    if (dbg_row >= 0) {
      *reinterpret_cast<uint2*>(p.dbg_hq + (size_t)dbg_row * 512 + col) = q;
      if (sub == 0) p.dbg_hs[dbg_row * 4 + grp] = sc;
    }
  }
  __syncwarp();  // h_q_k and its scales (this warp's writes) before the B fragments read them
  uint32_t b[4][8];
  float st[4];
#pragma unroll
  for (int kb = 0; kb < 4; ++kb) {
    moe::load_b(s_h + k * HROW + kb * 128 + t4 * 32, valid, b[kb]);
    st[kb] = valid ? s_hs[k * 4 + kb] : 0.0f;
  }
  mbar_wait(full4, 0);
  const uint8_t* tile = smem + OFF_DN + k * DN_TILE_BYTES + g * INTER + t4 * 32;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int kb = 0; kb < 4; ++kb) {
    uint4 a[4];
    moe::load_a(a, tile + kb * 128, INTER);
    moe::kblock_mma(acc, a, b[kb], s_w2s[k * 4 + kb], st[kb], t4);
  }
  if (t4 == 0) {
    s_y[k * 16 + g] = __bfloat162float(__float2bfloat16_rn(acc[0] * w));
    s_y[k * 16 + g + 8] = __bfloat162float(__float2bfloat16_rn(acc[2] * w));
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(F_THREADS, 1) moe_m1f(const LayerT1Params p) {
  extern __shared__ __align__(1024) uint8_t smem[];
  uint8_t* s_gu = smem + OFF_GU;
  const float* s_wsg = reinterpret_cast<const float*>(smem + OFF_SC);   // [16] gate rows' K-block scales
  const float* s_wsu = s_wsg + 16;                                       // [16] up rows'
  uint8_t* s_xq = smem + OFF_XQ;
  float* s_xs = reinterpret_cast<float*>(smem + OFF_XS);
  float* s_y = reinterpret_cast<float*>(smem + OFF_Y);
  // [0..3] gate_up tiles, [4] down share + w2 scales, [5] gate_up scales
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + OFF_BAR);
  __shared__ int s_pos[TOPK], s_ids[TOPK];
  __shared__ unsigned s_target;
  __shared__ float s_w[NR];
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const int c = blockIdx.x;
  const int kq = c >> 4;                 // this CTA's gate_up route (rank)
  const int j = c & 15;                  // its 32 columns [32 j, 32 j + 32)

  pdl_wait();
  pdl_trigger();
  // x first: the MMA warps' groups wid and wid + 8 (4 values per lane), in flight before any copy is issued
  uint2 xr[2];
  if (wid < F_MMA_WARPS) {
#pragma unroll
    for (int q = 0; q < 2; ++q) xr[q] = __ldg(reinterpret_cast<const uint2*>(p.x) + (wid + 8 * q) * 32 + lane);
  }
  if (tid == 0) {
    if (gridDim.x != F_CTAS || blockDim.x != F_THREADS) __trap();
    for (int s = 0; s < 6; ++s) mbar_init(&full[s], 1);
    mbar_fence_init();
    // the gate_up scales and tiles, then (M1F_W2_AFTER < 0) the w2 scales and tiles, each on its own mbarrier
    // every route count is 16 x (this launch) at entry: each launch adds 128 here and 16 to each route
    const unsigned launch_prev = atomicAdd(p.bar + 8, 1u);  // in flight with the id load below (used at the end)
    const int eg = __ldg(p.topk_ids + kq);
    mbar_expect_tx(&full[5], 128);
    bulk_g2s(smem + OFF_SC, p.w13_scale + ((size_t)eg * 8 + (j >> 2)) * 16, 64, &full[5]);
    bulk_g2s(smem + OFF_SC + 64, p.w13_scale + ((size_t)eg * 8 + 4 + (j >> 2)) * 16, 64, &full[5]);
    // gate_up tile w: gate rows [32 j + 8 w, +8) then up rows [512 + 32 j + 8 w, +8)
    const uint8_t* gsrc = p.w13 + ((size_t)eg * 1024 + 32 * j) * HID;
    const uint64_t wpol = l2_evict_first();
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      mbar_expect_tx(&full[w], GU_TILE_BYTES);
      bulk_g2s_hint(s_gu + w * GU_TILE_BYTES, gsrc + (size_t)(8 * w) * HID, GU_HALF_BYTES, &full[w], wpol);
      bulk_g2s_hint(s_gu + w * GU_TILE_BYTES + GU_HALF_BYTES, gsrc + (size_t)(512 + 8 * w) * HID, GU_HALF_BYTES, &full[w], wpol);
    }
    s_target = ((launch_prev >> 7) + 1u) * 16u;
  }
  if (tid < TOPK) {
    const int e = __ldg(p.topk_ids + tid);
    int pos = 0;
#pragma unroll
    for (int q = 0; q < TOPK; ++q) pos += __ldg(p.topk_ids + q) < e ? 1 : 0;
    s_ids[tid] = e;
    s_pos[tid] = pos;  // the route's position in route order (experts by increasing id), as moe_align
    s_w[tid] = __ldg(p.topk_w + tid);
  }
  if (tid == TOPK && p.sw2 != nullptr) s_w[TOPK] = __ldg(p.topk_w + TOPK);  // the shared expert's gate weight
  __syncthreads();  // the mbarriers are initialised
  const int g = lane >> 2, t4 = lane & 3;
  const bool valid = g == 0;
  if (wid < F_MMA_WARPS) {
    // x quantization (moe_align's quant_x_tile, token 0): warp w takes groups w and w + 8
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int grp = wid + 8 * q;
      float s;
      *reinterpret_cast<uint32_t*>(s_xq + grp * 128 + lane * 4) = moe::quant_group_warp(xr[q], s);
      if (lane == 0) s_xs[grp] = s;
    }
    asm volatile("bar.sync 5, %0;\n" ::"n"(F_MMA_THREADS) : "memory");  // x_q complete
    // gate_up tiles in landing order: warp w runs K blocks 2w, 2w + 1 (the token in B column 0: lanes g == 0), then
    // parks the raw fragments in the tile's first 8 KB once every MMA warp has read the tile, and signals the tile's
    // chain warp (named barrier 1 + tile: 8 MMA warps arrive, the chain warp syncs)
#pragma unroll 1
    for (int tt = 0; tt < 4; ++tt) {
      mbar_wait(&full[tt], 0);
      uint8_t* tbase = s_gu + tt * GU_TILE_BYTES;
      const uint8_t* tile = tbase + g * HID + t4 * 32;
      float d[2][4];
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) {
        const int kb = 2 * wid + h2;
        uint32_t bf[8];
        moe::load_b(s_xq + kb * 128 + t4 * 32, valid, bf);
        uint4 a[4];
        moe::load_a(a, tile + kb * 128, HID);
        moe::kblock_d(d[h2], a, bf);
      }
      asm volatile("bar.sync 5, %0;\n" ::"n"(F_MMA_THREADS) : "memory");  // tile tt read by every MMA warp
      float4* s_d = reinterpret_cast<float4*>(tbase);
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) s_d[(2 * wid + h2) * 32 + lane] = make_float4(d[h2][0], d[h2][1], d[h2][2], d[h2][3]);
      asm volatile("bar.arrive %0, %1;\n" ::"r"(1 + tt), "n"(F_MMA_THREADS + 32) : "memory");
    }
  } else {
    // chain warp 8 + tt: tile tt's scaled chain over K blocks 0..15 in order, then h of its 8 columns
    const int tt = wid - F_MMA_WARPS;
    if (tt == 3 && lane == 0) {  // the down share: output rows [16c, 16c + 16) of w2 for each of the 8 experts
      mbar_wait(&full[M1F_W2_AFTER], 0);
      int ids[TOPK];
#pragma unroll
      for (int k = 0; k < TOPK; ++k) ids[k] = s_ids[k];
      issue_down_share(p, ids, smem, &full[4], c);
    }
    mbar_wait(&full[5], 0);  // the gate_up scales
    asm volatile("bar.sync %0, %1;\n" ::"r"(1 + tt), "n"(F_MMA_THREADS + 32) : "memory");
    const float4* s_d = reinterpret_cast<const float4*>(s_gu + tt * GU_TILE_BYTES);
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int kb = 0; kb < 16; ++kb) {
      const float4 v = s_d[kb * 32 + lane];
      const float d[4] = {v.x, v.y, v.z, v.w};
      moe::kblock_acc2(acc, d, s_wsg[kb], s_wsu[kb], valid ? s_xs[kb] : 0.0f, t4);
    }
    if (t4 == 0) {  // token column 0: acc[0] gate (row g), acc[2] up (row g + 8) of column 32 j + 8 tt + g
      const float gt = __bfloat162float(__float2bfloat16_rn(acc[0]));
      const float up = __bfloat162float(__float2bfloat16_rn(acc[2]));
      p.gu[(size_t)s_pos[kq] * INTER + 32 * j + 8 * tt + g] = __float2bfloat16_rn(moe::silu_mul(gt, up));
    }
  }
  __syncthreads();  // every h store of this CTA precedes the arrival
  if (tid == 0) {
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(p.bar + kq) : "memory");
  }

  // MMA warp k, route k: waits for route k's 16 CTAs, then its down tile (down_route); chain warp 0: the shared expert's
  // down tile (its h is complete at entry)
  if (wid < F_MMA_WARPS) {
    const int k = wid;
    {  // every lane polls (its own acquire orders its h loads below)
      const unsigned target = s_target;
      unsigned polls = 0;
      while ((int)(ld_acquire_gpu(p.bar + k) - target) < 0) {
        if (++polls == (1u << 26)) __trap();  // a count that cannot complete: fail the launch instead of hanging
      }
    }
    down_route(p, p.gu + (size_t)s_pos[k] * INTER, k, p.dbg_hq != nullptr && c == 0 ? s_pos[k] : -1, smem, &full[4], s_w[k]);
  } else if (wid == F_MMA_WARPS && p.sw2 != nullptr) {
    down_route(p, p.sh_h, TOPK, -1, smem, &full[4], s_w[TOPK]);
  }
  __syncthreads();
  if (tid < 16) {  // top-k sum in rank order (FP32; the shared expert last), rounded once to BF16
    const int nr = p.sw2 != nullptr ? NR : TOPK;
    float s = 0.0f;
    for (int k = 0; k < nr; ++k) s += s_y[k * 16 + tid];
    p.out[c * 16 + tid] = __float2bfloat16_rn(s);
  }
}
