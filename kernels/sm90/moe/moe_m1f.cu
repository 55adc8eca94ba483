// MoE m1f: the whole routed MoE layer for ONE token in one cooperative kernel (issue 7, 1-token gate; round 8).
//
// m1 (moe_m1.cu) measured 16.1 us in graph replay against a 5.9 us byte floor. Its per-CTA timeline (run17,
// -DM1_TIMING=1, single launch, us from the first entry): copies issued 1.0; x quantized 6.1 (warp 0's x load
// queued behind the CTA's own 192 KB of TMA copies); gate_up done 8.5 (one warp per 16-row tile: a 2.3 us
// dependent MMA chain after the last tile landed); grid barrier 10.8 (2.3 us); h in shared memory 12.8 (gate|up
// from L2, SiLU and quantization after the barrier); down + top-k sum 14.1. m1f keeps m1's plan (every CTA's
// weights requested up front, the top-k sum local to the CTA) and shortens every phase around the stream (run17:
// 9.98 us single launch with M1F_ROUTE_FLAGS=1; tune m1fl's record: 12.33 vs SGLang 24.76 us in graph replay, 2.01x):
//   * x is read by the MMA warps at entry (before any copy is issued), the weight scales arrive by TMA ahead of their
//     tiles: no operand load waits behind the stream (run17: a TMA copy of x issued first still landed at 4-6 us);
//   * the down share's copies wait until gate_up tile M1F_W2_AFTER has landed (all of gate_up is on the critical
//     path, the w2 rows only after the grid barrier);
//   * gate_up tile = 8 gate + 8 up rows of the same 8 columns (two 16 KB copies; moe_ms / moe_ml's pairing), so the
//     CTA computes h = bf16(SiLU(bf16 gate) * bf16 up) itself and writes 32 BF16 h values, not gate|up;
//   * 8 MMA warps work on every tile as it lands: warp w runs the MMAs of K blocks 2w, 2w + 1 (moe_common.cuh
//     kblock_d) and parks the raw fragments in the tile's own shared memory once every MMA warp has read it; a
//     chain warp per tile (warps 8..11) then runs the tile's scaled FP32 chain over K blocks 0..15 in order
//     (kblock_acc2) - one warp's arithmetic, so the numerics are st8's bitwise - while the MMA warps go on to the
//     next tile (run17's first build made every warp wait for each chain: 1.2 us per tile, slower than m1);
//   * no grid barrier: each route has an arrival counter that only grows (16 per launch); MMA warp k waits for route
//     k's 16 CTAs only, then quantizes h_k (no SiLU left) and runs route k's down tile, so the routes that completed
//     early are quantized and multiplied while the last ones are still arriving. The count to wait for comes from a
//     launch counter every CTA reads at entry, so a CTA's arrival is a fence + a reduction nobody waits for
//     (M1F_ROUTE_FLAGS=2; 1: from the arrival atomic's return; 0: a grid barrier on a growing count, moe_sync.cuh
//     grid_arrive_wait_mono, 0.26 us slower than 1). h exchanged as self-validating tagged words instead (no counter at
//     all) failed at launch and is kept under rejected/ (moe_m1f_tagged.cu.txt).
// Numerics of the v3 st8 sequence (align -> gate_up -> down) bitwise by construction: x quantized as moe_align
// (IEEE divisions, RNE), the swapped-operand mma.sync m16n8k32 e4m3 core with the same K permutation and the same
// per-K-block FP32 scaling chain per (row, token) element (an element depends only on its row of A and its column
// of B, so which rows share a tile changes no bit), gate / up rounded to BF16 before SiLU, h quantized per 128 with
// IEEE divisions, y = bf16(acc * w_k), the 8 routes summed in rank order in FP32 and rounded once.
//
// Grid = 128 CTAs (cooperative: all co-resident or the launch fails), 384 threads (8 MMA warps + 4 chain warps),
// ~199 KB of dynamic shared memory. CTA c: route kq = c / 16, columns [32 j, 32 j + 32) with j = c % 16 (gate rows 32 j.., up rows
// 512 + 32 j..); down: output rows [16 c, 16 c + 16) of all 8 experts.
// Params: M1Params of moe_m1.cu (the host fills both the same way); `gu` holds h here: [8, 512] BF16, route order
// (experts by increasing id, as moe_align's slots). dbg_hq / dbg_hs: CTA 0's copy of h_q / h_s (route order).
// Workspace (zeroed once, only grows): words 0..7 = the routes' arrival counts (16 per launch each), word 8 = the launch
// counter (128 per launch): at launch L every route count is 16 L (M1F_ROUTE_FLAGS=0: word 0 = the grid barrier's count).
// One stream at a time per device. The shared expert (a 9th route) is not supported: the host runs the st8 sequence for it.
#include "moe_common.cuh"
#include "moe_sync.cuh"
#include <stddef.h>

#ifndef M1F_ROUTE_FLAGS               // >= 1: no grid barrier: after its h stores a CTA adds 1 to its route's counter (workspace
#define M1F_ROUTE_FLAGS 2             // words 0..7, 16 per launch each), and MMA warp k waits only for route k's count before
#endif                                // it quantizes h_k and runs route k's down tile. 2: the counts to wait for come from a
                                      // launch counter read at entry (word 8, 128 per launch, in flight with the id load), so
                                      // the arrival is a fence + a reduction whose result nobody waits for and the MMA warps
                                      // start polling at once; 1: from the arrival atomic's return (run17: 12.1 / 12.4 us in
                                      // graph replay); 0: a grid barrier (run17's first build)
#ifndef M1F_W2_AFTER                  // the down share's copies are issued once gate_up tile M1F_W2_AFTER has landed (by
#define M1F_W2_AFTER 2                // chain warp 3), so that they do not take bandwidth from the gate_up tiles the
#endif                                // layer waits for first; -1: with the gate_up copies at entry (run17 timeline)

#ifndef M1F_REL                       // 1 (round 10, adopted with M1F_L2HINT: run19 l 0.988 of the time together, bitwise): the
#define M1F_REL 1                     // route count published with red.release
#endif
#ifndef M1F_SEPARATE_AQ               // 1 (round 11; contract moe_m1f_aq_e256_k8, the act+quant A/B twin): the gate_up CTA writes
#define M1F_SEPARATE_AQ 0             // BF16 gate and up ([8 routes][1024], route order, as the st8 cache) instead of h; SiLU*up +
#endif                                // quantization run as their own step: once route k is complete, chain warp 0 of CTAs
                                      // (k, 4q) computes group q of h_q_k / h_s_k (moe_act_quant's arithmetic) into global memory
                                      // (gu + M1F_AQ_OFF) and adds 1 to the route's second count (workspace words 16..23, 4 per
                                      // launch); MMA warp k waits for that count and copies h_q_k / h_s_k instead of quantizing
#define M1F_AQ_OFF 65536              // byte offset in gu of the twin's h_q [8][512] e4m3, then h_s [8][4] FP32
#define M1F_AQ_WORD 16                // the twin's second counts: workspace words [16, 24)
#ifndef M1F_PDL                       // 1 (round 11, adopted: run20 a / b 0.977 / 0.964 of the time in interleaved graph replay,
#define M1F_PDL 1                     // bitwise): launched with programmatic stream serialization, every thread executes
#endif                                // griddepcontrol.wait at entry, before any global read (x, the ids and weights come from
                                      // the previous kernel, the counters from the previous launch), then launch_dependents (a
                                      // dependent is scheduled once all 128 CTAs are resident and waits for this grid's end).
                                      // Contract launch: cooperative + pdl. 0: round 10's code object, byte for byte
#ifndef M1F_L2HINT                    // 1 (round 10, adopted): the weight copies carry an L2 evict_first policy (read once),
#define M1F_L2HINT 1                  // as moe_ml's (run19: it keeps the intermediates and counters in L2 under the stream)
#endif
#if M1F_L2HINT
#define M1F_W_COPY(dst, src, bytes, bar) bulk_g2s_hint(dst, src, bytes, bar, wpol)
#else
#define M1F_W_COPY(dst, src, bytes, bar) bulk_g2s(dst, src, bytes, bar)
#endif
#define HID 2048
#define INTER 512
#define TOPK 8
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
#define OFF_DN (OFF_GU + 4 * GU_TILE_BYTES)           // 131072: 8 x 8 KB
#define OFF_SC (OFF_DN + TOPK * DN_TILE_BYTES)        // 196608: w13 scales gate [16] | up [16], w2 scales [8][4]
#define SC_BYTES (32 * 4 + TOPK * 16)                 // 256
#define OFF_XQ (OFF_SC + SC_BYTES)                    // 196864: x_q [2048] E4M3
#define OFF_XS (OFF_XQ + HID)                         // 198912: x_s [16] FP32
#define D_BYTES (16 * 32 * 16)                        // raw fragments of a tile [16 kb][32 lanes][4]: in the tile's own
                                                      // first 8 KB once the MMA warps have read it
#define OFF_H (OFF_XS + 64)                           // 198976: h_q [8][HROW]
#define OFF_HS (OFF_H + TOPK * HROW)                  // 203200: h_s [8][4]
#define OFF_Y (OFF_HS + TOPK * 4 * 4)                 // 203328: y [8][16] FP32
#define OFF_BAR (OFF_Y + TOPK * 16 * 4)               // 203840: 6 mbarriers
#define F_SMEM (OFF_BAR + 64)                         // 203904
static_assert(OFF_SC % 16 == 0 && OFF_XQ % 16 == 0 && OFF_H % 16 == 0 &&
              OFF_BAR % 8 == 0, "alignment");
static_assert(F_SMEM <= 232448, "shared memory");

#include "moe_m1_params.cuh"  // struct M1Params + netra_params_layout (shared by moe_m1 / moe_m1f)

#ifndef M1F_TIMING
#define M1F_TIMING 0                  // 1 (exploration builds only): %globaltimer stamps per CTA and phase
#endif
#define M1F_TIMING_OFFSET (512 * 1024)  // bytes into gu: u64 [128 CTAs][16 stamps] (as moe_m1.cu's M1_TIMING)

namespace {

__device__ __forceinline__ void stamp(const M1Params& p, int k) {
#if M1F_TIMING
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  reinterpret_cast<unsigned long long*>(reinterpret_cast<uint8_t*>(p.gu) + M1F_TIMING_OFFSET)[blockIdx.x * 16 + k] = t;
#else
  (void)p;
  (void)k;
#endif
}

// The down share: the w2 scales and output rows [16c, 16c + 16) of w2 for each of the 8 experts.
__device__ __forceinline__ void issue_down_share(const M1Params& p, const int (&ids)[TOPK], uint8_t* smem, uint64_t* bar, int c) {
  mbar_expect_tx(bar, TOPK * DN_TILE_BYTES + TOPK * 16);
#if M1F_L2HINT
  const uint64_t wpol = l2_evict_first();
#endif
#pragma unroll
  for (int k = 0; k < TOPK; ++k)
    bulk_g2s(smem + OFF_SC + 128 + 16 * k, p.w2_scale + ((size_t)ids[k] * 16 + (c >> 3)) * 4, 16, bar);
#pragma unroll
  for (int k = 0; k < TOPK; ++k)
    M1F_W_COPY(smem + OFF_DN + k * DN_TILE_BYTES, p.w2 + ((size_t)ids[k] * HID + c * 16) * INTER, DN_TILE_BYTES, bar);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(F_THREADS, 1) moe_m1f(const M1Params p) {
  extern __shared__ __align__(1024) uint8_t smem[];
  uint8_t* s_gu = smem + OFF_GU;
  uint8_t* s_dn = smem + OFF_DN;
  const float* s_wsg = reinterpret_cast<const float*>(smem + OFF_SC);   // [16] gate rows' K-block scales
  const float* s_wsu = s_wsg + 16;                                       // [16] up rows'
  const float* s_w2s = s_wsg + 32;                                       // [8 routes][4]
  uint8_t* s_xq = smem + OFF_XQ;
  float* s_xs = reinterpret_cast<float*>(smem + OFF_XS);
  uint8_t* s_h = smem + OFF_H;
  float* s_hs = reinterpret_cast<float*>(smem + OFF_HS);
  float* s_y = reinterpret_cast<float*>(smem + OFF_Y);
  // [0..3] gate_up tiles, [4] down share + w2 scales, [5] gate_up scales
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + OFF_BAR);
  __shared__ int s_pos[TOPK], s_ids[TOPK];
#if M1F_ROUTE_FLAGS
  __shared__ unsigned s_target;
#endif
  __shared__ float s_w[TOPK];
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const int c = blockIdx.x;
  const int kq = c >> 4;                 // this CTA's gate_up route (rank)
  const int j = c & 15;                  // its 32 columns [32 j, 32 j + 32)

  if (tid == 0) stamp(p, 0);  // entry
#if M1F_PDL
  pdl_wait();
  pdl_trigger();
#endif
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
#if M1F_ROUTE_FLAGS == 2
    // every route count is 16 x (this launch) at entry: each launch adds 128 here and 16 to each route
    const unsigned launch_prev = atomicAdd(p.bar + 8, 1u);  // in flight with the id load below (used at the end)
#endif
    const int eg = __ldg(p.topk_ids + kq);
    mbar_expect_tx(&full[5], 128);
    bulk_g2s(smem + OFF_SC, p.w13_scale + ((size_t)eg * 8 + (j >> 2)) * 16, 64, &full[5]);
    bulk_g2s(smem + OFF_SC + 64, p.w13_scale + ((size_t)eg * 8 + 4 + (j >> 2)) * 16, 64, &full[5]);
    // gate_up tile w: gate rows [32 j + 8 w, +8) then up rows [512 + 32 j + 8 w, +8)
    const uint8_t* gsrc = p.w13 + ((size_t)eg * 1024 + 32 * j) * HID;
#if M1F_L2HINT
    const uint64_t wpol = l2_evict_first();
#endif
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      mbar_expect_tx(&full[w], GU_TILE_BYTES);
      M1F_W_COPY(s_gu + w * GU_TILE_BYTES, gsrc + (size_t)(8 * w) * HID, GU_HALF_BYTES, &full[w]);
      M1F_W_COPY(s_gu + w * GU_TILE_BYTES + GU_HALF_BYTES, gsrc + (size_t)(512 + 8 * w) * HID, GU_HALF_BYTES, &full[w]);
    }
#if M1F_W2_AFTER < 0
    int ids[TOPK];
#pragma unroll
    for (int k = 0; k < TOPK; ++k) ids[k] = __ldg(p.topk_ids + k);
    issue_down_share(p, ids, smem, &full[4], c);
#endif
#if M1F_ROUTE_FLAGS == 2
    s_target = ((launch_prev >> 7) + 1u) * 16u;
#endif
    stamp(p, 1);  // every copy issued
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
    if (tid == 0) stamp(p, 2);  // x quantized
    // gate_up tiles in landing order: warp w runs K blocks 2w, 2w + 1 (the token in B column 0: lanes g == 0), then
    // parks the raw fragments in the tile's first 8 KB once every MMA warp has read the tile, and signals the tile's
    // chain warp (named barrier 1 + tile: 8 MMA warps arrive, the chain warp syncs)
#pragma unroll 1
    for (int tt = 0; tt < 4; ++tt) {
      mbar_wait(&full[tt], 0);
      if (tid == 0) stamp(p, 3 + tt);  // tile tt in (warp 0's view)
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
#if M1F_W2_AFTER >= 0
    if (tt == 3 && lane == 0) {  // the down share: output rows [16c, 16c + 16) of w2 for each of the 8 experts
      mbar_wait(&full[M1F_W2_AFTER], 0);
      int ids[TOPK];
#pragma unroll
      for (int k = 0; k < TOPK; ++k) ids[k] = s_ids[k];
      issue_down_share(p, ids, smem, &full[4], c);
      stamp(p, 12);  // the down share's copies issued
    }
#endif
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
#if M1F_SEPARATE_AQ
      p.gu[(size_t)s_pos[kq] * 2 * INTER + 32 * j + 8 * tt + g] = __float2bfloat16_rn(acc[0]);  // gate|up, as st8's cache
      p.gu[(size_t)s_pos[kq] * 2 * INTER + INTER + 32 * j + 8 * tt + g] = __float2bfloat16_rn(acc[2]);
      (void)gt;
      (void)up;
#else
      p.gu[(size_t)s_pos[kq] * INTER + 32 * j + 8 * tt + g] = __float2bfloat16_rn(moe::silu_mul(gt, up));
#endif
    }
    if (tt == 3 && lane == 0) stamp(p, 13);  // tile 3's h stored
  }
  __syncthreads();  // every h store of this CTA precedes the arrival
#if M1F_ROUTE_FLAGS == 2
  if (tid == 0) {
    stamp(p, 7);  // gate_up done
#if M1F_REL  // a release reduction (fence.acq_rel + red) instead of fence.sc + atomic, as moe_ml's ML_REL_ATOM
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(p.bar + kq) : "memory");
#else
    __threadfence();
    atomicAdd(p.bar + kq, 1u);  // result unused: a reduction, nobody waits for it
#endif
  }
#elif M1F_ROUTE_FLAGS
  if (tid == 0) {
    stamp(p, 7);  // gate_up done
    __threadfence();
    const unsigned prev = atomicAdd(p.bar + kq, 1u);  // every route's count is a multiple of 16 at launch start
    s_target = (prev & ~15u) + 16u;
  }
  __syncthreads();
#else
  if (tid == 0) {
    stamp(p, 7);  // gate_up done
    grid_arrive_wait_mono(p.bar, gridDim.x);
    stamp(p, 8);  // grid barrier passed
  }
  __syncthreads();
#endif

#if M1F_SEPARATE_AQ
  static_assert(M1F_ROUTE_FLAGS == 2, "M1F_SEPARATE_AQ: the launch-counter route counts");
  uint8_t* const aq_q = reinterpret_cast<uint8_t*>(p.gu) + M1F_AQ_OFF;
  float* const aq_s = reinterpret_cast<float*>(aq_q + TOPK * INTER);
  if (wid == F_MMA_WARPS && (j & 3) == 0) {  // the act+quant step: route kq, 128-group q = j / 4 (both half-warps compute it)
    const unsigned target = s_target;
    unsigned polls = 0;
    while ((int)(ld_acquire_gpu(p.bar + kq) - target) < 0) {
      if (++polls == (1u << 26)) __trap();
    }
    const int q = j >> 2, sub = lane & 15, col = q * 128 + sub * 8;
    const __nv_bfloat16* src = p.gu + (size_t)s_pos[kq] * 2 * INTER + col;
    float gf[8], uf[8], h[8];
    moe::bf16x8_to_float(__ldcg(reinterpret_cast<const uint4*>(src)), gf);
    moe::bf16x8_to_float(__ldcg(reinterpret_cast<const uint4*>(src + INTER)), uf);
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      h[i] = __bfloat162float(__float2bfloat16_rn(moe::silu_mul(gf[i], uf[i])));
      amax = fmaxf(amax, fabsf(h[i]));
    }
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float sc = moe::group_scale(amax);
    if (lane < 16) {
      uint2 v;
      v.x = moe::quant4(h[0], h[1], h[2], h[3], sc);
      v.y = moe::quant4(h[4], h[5], h[6], h[7], sc);
      *reinterpret_cast<uint2*>(aq_q + (size_t)s_pos[kq] * INTER + col) = v;
      if (sub == 0) aq_s[s_pos[kq] * 4 + q] = sc;
    }
    __syncwarp();
    if (lane == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(p.bar + M1F_AQ_WORD + kq) : "memory");
  }
#endif
#if M1F_TIMING
  if (wid == F_MMA_WARPS + 3 && lane == 0) {  // timing builds only: the down share's landing, by a warp that is idle until the
    mbar_wait(&full[4], 0);                    // last __syncthreads anyway
    stamp(p, 14);
  }
#endif
  // MMA warp k, route k: h_q_k (st8's down prologue arithmetic without the SiLU: half-warp hw takes 128-groups 2hw and
  // 2hw + 1, 8 values per lane), then output rows [16c, 16c + 16) of expert ids[k] (one 16-row tile, as one q tile
  // of an st8 down item) with h_k in B column 0; y_k = bf16(acc * w_k)
  if (wid < F_MMA_WARPS) {
    const int k = wid;
#if M1F_ROUTE_FLAGS
    {  // every lane polls (its own acquire orders its h loads below)
      const unsigned target = s_target;
      unsigned polls = 0;
      while ((int)(ld_acquire_gpu(p.bar + k) - target) < 0) {
        if (++polls == (1u << 26)) __trap();  // a count that cannot complete: fail the launch instead of hanging
      }
    }
    if (tid == 0) stamp(p, 8);  // route 0 complete
#endif
#if M1F_SEPARATE_AQ
    {  // the act+quant step's h_q_k / h_s_k (4 groups published), copied to shared memory
      const unsigned target = s_target >> 2;  // 4 per launch
      unsigned polls = 0;
      while ((int)(ld_acquire_gpu(p.bar + M1F_AQ_WORD + k) - target) < 0) {
        if (++polls == (1u << 26)) __trap();
      }
      const uint4 qv = __ldcg(reinterpret_cast<const uint4*>(aq_q + (size_t)s_pos[k] * INTER) + lane);
      *reinterpret_cast<uint4*>(s_h + k * HROW + lane * 16) = qv;
      if (lane < 4) s_hs[k * 4 + lane] = __ldcg(aq_s + s_pos[k] * 4 + lane);
      if (p.dbg_hq != nullptr && c == 0) {
        *reinterpret_cast<uint4*>(p.dbg_hq + (size_t)s_pos[k] * 512 + lane * 16) = qv;
        if (lane < 4) p.dbg_hs[s_pos[k] * 4 + lane] = s_hs[k * 4 + lane];
      }
    }
#else
    const int hw = lane >> 4, sub = lane & 15;
    uint4 hv[2];
#pragma unroll
    for (int u = 0; u < 2; ++u)
      hv[u] = __ldcg(reinterpret_cast<const uint4*>(p.gu + (size_t)s_pos[k] * INTER + (2 * hw + u) * 128 + sub * 8));
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int grp = 2 * hw + u, col = grp * 128 + sub * 8;
      float h[8];
      moe::bf16x8_to_float(hv[u], h);
      float amax = 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(h[i]));
#pragma unroll
      for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      const float sc = moe::group_scale(amax);
      uint2 q;
      q.x = moe::quant4(h[0], h[1], h[2], h[3], sc);
      q.y = moe::quant4(h[4], h[5], h[6], h[7], sc);
      *reinterpret_cast<uint2*>(s_h + k * HROW + col) = q;
      if (sub == 0) s_hs[k * 4 + grp] = sc;
      if (p.dbg_hq != nullptr && c == 0) {
        const size_t r = (size_t)s_pos[k];
        *reinterpret_cast<uint2*>(p.dbg_hq + r * 512 + col) = q;
        if (sub == 0) p.dbg_hs[r * 4 + grp] = sc;
      }
    }
#endif  // M1F_SEPARATE_AQ
    __syncwarp();  // h_q_k and its scales (this warp's writes) before the B fragments read them
    if (tid == 0) stamp(p, 9);  // h_q_0 in shared memory
    uint32_t b[4][8];
    float st[4];
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      moe::load_b(s_h + k * HROW + kb * 128 + t4 * 32, valid, b[kb]);
      st[kb] = valid ? s_hs[k * 4 + kb] : 0.0f;
    }
    mbar_wait(&full[4], 0);
    if (tid == 0) stamp(p, 10);  // the down share in
    const uint8_t* tile = s_dn + k * DN_TILE_BYTES + g * INTER + t4 * 32;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      uint4 a[4];
      moe::load_a(a, tile + kb * 128, INTER);
      moe::kblock_mma(acc, a, b[kb], s_w2s[k * 4 + kb], st[kb], t4);
    }
    if (t4 == 0) {
      const float w = s_w[k];
      s_y[k * 16 + g] = __bfloat162float(__float2bfloat16_rn(acc[0] * w));
      s_y[k * 16 + g + 8] = __bfloat162float(__float2bfloat16_rn(acc[2] * w));
    }
  }
  __syncthreads();
  if (tid == 0) stamp(p, 15);  // every route's y in shared memory
  if (tid < 16) {  // top-k sum in rank order (FP32), rounded once to BF16
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < TOPK; ++k) s += s_y[k * 16 + tid];
    p.out[c * 16 + tid] = __float2bfloat16_rn(s);
  }
  if (tid == 0) stamp(p, 11);  // out written (thread 0's share)
}
