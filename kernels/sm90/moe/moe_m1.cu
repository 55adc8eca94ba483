// MoE m1: the whole routed MoE layer for ONE token in one cooperative kernel (issue 7, 1-token gate).
//
// Inputs are the align inputs (x [1, 2048] BF16, top-8 ids int32 and weights FP32 in rank order); the
// output is out [1, 2048] BF16 with the numerics of the v3 st8 sequence (align -> gate_up -> down),
// bitwise by construction: the same x quantization (moe_common.cuh, IEEE divisions, RNE), the same
// swapped-operand mma.sync m16n8k32 e4m3 core with the same K permutation and per-128-K-block FP32
// scaling order, the same fused SiLU*up + quantization, each route's 16-row MMA tile accumulated in the
// same kb order, y = bf16(acc * w_k), routes summed in rank order in FP32, rounded once to BF16.
//
// Grid = 128 CTAs (one per SM; cooperative launch: all co-resident or the launch fails), 256 threads,
// ~198 KB of dynamic shared memory. CTA c:
//   1. thread 0 reads the 8 ids and issues, at once, TMA 1D bulk copies of ALL of this CTA's weights:
//      gate_up: route k = c / 16, gate|up rows [64 (c % 16), +64) of expert ids[k] (4 x 32 KB, one
//      mbarrier each: warp w's 16-row tile); down: output rows [16c, 16c + 16) of w2 for each of the 8
//      experts (8 x 8 KB, one mbarrier), so the top-k sum of those rows is local to the CTA.
//   2. every warp quantizes 2 of x's 16 groups into shared memory (redundant per CTA, as moe_align).
//   3. warps 0-3: one 16-row gate_up tile each (16 K blocks x 4 MMAs, the token in B column 0), BF16
//      gate|up to the global cache gu at the route's position in route order (experts by increasing id,
//      as moe_align's metadata), so gu (and dbg_hq) are laid out as the st8 sequence's at M = 1.
//   4. grid-wide barrier: a self-resetting arrival counter (word 0 of the workspace) + a generation
//      word (word 32): release (fence + atomic) / acquire (ld.acquire.gpu) at GPU scope.
//   5. every CTA computes h = quant(bf16(SiLU(gate) * up)) of the 8 routes (8 x 512) from gu (L2) into
//      shared memory; warp k multiplies its 16 w2 rows of route k by h_k, y_k = bf16(acc * w_k) to shared
//      memory; 16 threads sum the 8 routes in rank order into out[16c + r].
// Workspace: word 0 returns to 0 after every launch, word 32 only increments: replays need no memset.
// One stream at a time per device (the workspace is per code object). The shared expert (a 9th route)
// is not supported here (its gate_up share would not fit beside the down share): the host falls back.
#include "moe_common.cuh"
#include "moe_sync.cuh"
#include <stddef.h>

#define HID 2048
#define INTER 512
#define TOPK 8
#define M1_CTAS 128
#define M1_THREADS 256
#define GU_TILE_BYTES 32768            // 16 rows x 2048 B
#define DN_TILE_BYTES 8192             // 16 rows x 512 B
#define HROW 528                       // h row stride in shared memory (as expert_stream.cu)
// dynamic shared memory layout
#define OFF_GU 0
#define OFF_DN (OFF_GU + 4 * GU_TILE_BYTES)          // 131072
#define OFF_XQ (OFF_DN + TOPK * DN_TILE_BYTES)       // 196608
#define OFF_XS (OFF_XQ + HID)                        // 198656: 16 floats
#define OFF_H (OFF_XS + 64)                          // 198720: 8 x HROW
#define OFF_HS (OFF_H + TOPK * HROW)                 // 202944: 8 x 4 floats
#define OFF_Y (OFF_HS + TOPK * 4 * 4)                // 203072: 8 x 16 floats
#define OFF_BAR (OFF_Y + TOPK * 16 * 4)              // 203584: 5 mbarriers
#define M1_SMEM (OFF_BAR + 64)                       // 203648
static_assert(OFF_BAR % 8 == 0 && OFF_XQ % 16 == 0 && OFF_H % 16 == 0, "alignment");

#include "moe_m1_params.cuh"  // struct M1Params + netra_params_layout (shared by moe_m1 / moe_m1f)

#ifndef M1_TIMING
#define M1_TIMING 0                   // 1 (exploration builds only): %globaltimer stamps per CTA and phase
#endif
#define M1_TIMING_OFFSET (512 * 1024) // bytes into gu: u64 [128 CTAs][16 stamps]

namespace {

__device__ __forceinline__ void stamp(const M1Params& p, int k) {
#if M1_TIMING
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  reinterpret_cast<unsigned long long*>(reinterpret_cast<uint8_t*>(p.gu) + M1_TIMING_OFFSET)[blockIdx.x * 16 + k] = t;
#else
  (void)p;
  (void)k;
#endif
}

// ---------------------------------------------------------------- MMA core (moe_common.cuh)
using moe::kblock_mma;
using moe::load_b;
__device__ __forceinline__ void load_a_smem(uint4 (&a)[4], const uint8_t* row_g, int row_stride) {
  moe::load_a(a, row_g, row_stride);
}

// Grid-wide barrier (cooperative launch: every CTA is resident): moe_sync.cuh's arrival between two
// CTA barriers.
__device__ __forceinline__ void grid_sync(unsigned* bar) {
  __syncthreads();
  if (threadIdx.x == 0) grid_arrive_wait(bar, gridDim.x);
  __syncthreads();
}

}  // namespace

extern "C" __global__ void __launch_bounds__(M1_THREADS, 1) moe_m1(const M1Params p) {
  extern __shared__ __align__(1024) uint8_t smem[];
  uint8_t* s_gu = smem + OFF_GU;
  uint8_t* s_dn = smem + OFF_DN;
  uint8_t* s_xq = smem + OFF_XQ;
  float* s_xs = reinterpret_cast<float*>(smem + OFF_XS);
  uint8_t* s_h = smem + OFF_H;
  float* s_hs = reinterpret_cast<float*>(smem + OFF_HS);
  float* s_y = reinterpret_cast<float*>(smem + OFF_Y);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + OFF_BAR);  // [0..3] gate_up tiles, [4] down
  __shared__ int s_ids[TOPK], s_pos[TOPK];
  __shared__ float s_w[TOPK];
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const int c = blockIdx.x;
  const int kq = c >> 4;                 // this CTA's gate_up route (rank)
  const int row0 = (c & 15) * 64;        // its first gate|up row

  if (tid == 0) stamp(p, 0);  // entry
  if (tid == 0) {
    if (gridDim.x != M1_CTAS || blockDim.x != M1_THREADS) __trap();
    const int eg = __ldg(p.topk_ids + kq);
    for (int s = 0; s < 5; ++s) mbar_init(&full[s], 1);
    mbar_fence_init();
    // gate_up first (needed first), then the down share: all of this CTA's bytes in flight from here
    const uint8_t* gsrc = p.w13 + ((size_t)eg * 1024 + row0) * HID;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      mbar_expect_tx(&full[w], GU_TILE_BYTES);
      bulk_g2s(s_gu + w * GU_TILE_BYTES, gsrc + (size_t)w * GU_TILE_BYTES, GU_TILE_BYTES, &full[w]);
    }
    mbar_expect_tx(&full[4], TOPK * DN_TILE_BYTES);
#pragma unroll
    for (int k = 0; k < TOPK; ++k)
      bulk_g2s(s_dn + k * DN_TILE_BYTES, p.w2 + ((size_t)__ldg(p.topk_ids + k) * HID + c * 16) * INTER, DN_TILE_BYTES, &full[4]);
    stamp(p, 1);  // every copy issued
  }
  if (tid < TOPK) {
    const int e = __ldg(p.topk_ids + tid);
    int pos = 0;
#pragma unroll
    for (int j = 0; j < TOPK; ++j) pos += __ldg(p.topk_ids + j) < e ? 1 : 0;
    s_ids[tid] = e;
    s_pos[tid] = pos;  // the route's position in route order (experts by increasing id), as moe_align
    s_w[tid] = __ldg(p.topk_w + tid);
  }
  // x quantization (moe_align's quant_x_tile, token 0): warp w takes groups w and w + 8
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    const int grp = wid + 8 * q;
    float s;
    *reinterpret_cast<uint32_t*>(s_xq + grp * 128 + lane * 4) =
        moe::quant_group_warp(__ldg(reinterpret_cast<const uint2*>(p.x + grp * 128 + lane * 4)), s);
    if (lane == 0) s_xs[grp] = s;
  }
  __syncthreads();
  if (tid == 0) stamp(p, 2);  // x quantized

  const int g = lane >> 2, t = lane & 3;
  if (wid < 4) {  // gate_up: warp w's 16 rows, the token in B column 0 (lanes g == 0), as the st8 gate_up
    const int e = s_ids[kq];
    const int n0 = row0 + wid * 16;
    const float wsl = lane < 16 ? __ldg(p.w13_scale + ((size_t)e * 8 + n0 / 128) * 16 + lane) : 0.0f;
    const bool valid = g == 0;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    const uint8_t* xrow = s_xq + t * 32;
    mbar_wait(&full[wid], 0);
    if (lane == 0) stamp(p, 3 + wid);  // gate_up tile wid in
    const uint8_t* tile = s_gu + wid * GU_TILE_BYTES + g * HID + t * 32;
#pragma unroll 4
    for (int kb = 0; kb < 16; ++kb) {
      uint32_t b[8];
      load_b(xrow + kb * 128, valid, b);
      const float st = valid ? s_xs[kb] : 0.0f;
      uint4 a[4];
      load_a_smem(a, tile + kb * 128, HID);
      kblock_mma(acc, a, b, __shfl_sync(0xffffffffu, wsl, kb), st, t);
    }
    if (t == 0) {  // token column 0: acc[0] (row g), acc[2] (row g + 8)
      __nv_bfloat16* dst = p.gu + (size_t)s_pos[kq] * 1024 + n0 + g;
      dst[0] = __float2bfloat16_rn(acc[0]);
      dst[8] = __float2bfloat16_rn(acc[2]);
    }
  }

#if M1_TIMING
  __syncthreads();
  if (tid == 0) stamp(p, 7);  // gate_up done (every warp)
#endif
  grid_sync(p.bar);
  if (tid == 0) stamp(p, 8);  // grid barrier passed

  // h of the 8 routes (as the st8 down's dn_group_h): (route, 128-group) pairs over the 16 half-warps
  {
    const int hw = lane >> 4, sub = lane & 15;
    uint4 gv[2], uv[2];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int idx = 2 * wid + hw + 16 * u;  // 0..31: route idx >> 2 (rank), group idx & 3
      const __nv_bfloat16* src = p.gu + (size_t)s_pos[idx >> 2] * 1024 + (idx & 3) * 128 + sub * 8;
      gv[u] = __ldcg(reinterpret_cast<const uint4*>(src));
      uv[u] = __ldcg(reinterpret_cast<const uint4*>(src + 512));
    }
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int idx = 2 * wid + hw + 16 * u;
      const int k = idx >> 2, grp = idx & 3, col = grp * 128 + sub * 8;
      float gf[8], uf[8], h[8];
      moe::bf16x8_to_float(gv[u], gf);
      moe::bf16x8_to_float(uv[u], uf);
      float amax = 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        h[i] = __bfloat162float(__float2bfloat16_rn(moe::silu_mul(gf[i], uf[i])));
        amax = fmaxf(amax, fabsf(h[i]));
      }
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
  }
  __syncthreads();
  if (tid == 0) stamp(p, 9);  // h of the 8 routes in shared memory

  // down: warp k, route k: output rows [16c, 16c + 16) of expert ids[k] (one 16-row tile, as one q tile
  // of an st8 down item), h_k in B column 0; y_k = bf16(acc * w_k)
  {
    const int k = wid;
    const int e = s_ids[k];
    const float wsl = lane < 4 ? __ldg(p.w2_scale + ((size_t)e * 16 + (c * 16) / 128) * 4 + lane) : 0.0f;
    const bool valid = g == 0;
    uint32_t b[4][8];
    float st[4];
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      load_b(s_h + k * HROW + kb * 128 + t * 32, valid, b[kb]);
      st[kb] = valid ? s_hs[k * 4 + kb] : 0.0f;
    }
    float wsk[4];
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) wsk[kb] = __shfl_sync(0xffffffffu, wsl, kb);
    mbar_wait(&full[4], 0);
    if (tid == 0) stamp(p, 10);  // the down share in
    const uint8_t* tile = s_dn + k * DN_TILE_BYTES + g * INTER + t * 32;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      uint4 a[4];
      load_a_smem(a, tile + kb * 128, INTER);
      kblock_mma(acc, a, b[kb], wsk[kb], st[kb], t);
    }
    if (t == 0) {
      const float w = s_w[k];
      s_y[k * 16 + g] = __bfloat162float(__float2bfloat16_rn(acc[0] * w));
      s_y[k * 16 + g + 8] = __bfloat162float(__float2bfloat16_rn(acc[2] * w));
    }
  }
  __syncthreads();
  if (tid < 16) {  // top-k sum in rank order (FP32), rounded once to BF16
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < TOPK; ++k) s += s_y[k * 16 + tid];
    p.out[c * 16 + tid] = __float2bfloat16_rn(s);
  }
  if (tid == 0) stamp(p, 11);  // out written (thread 0's share)
}
