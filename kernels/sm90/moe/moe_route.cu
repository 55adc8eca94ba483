// MoE routing for 1..128 tokens: router logits (BF16), top-8 by logit with ties to the lowest expert index, and the
// weights renormalised over the 8 (softmax restricted to the top 8), in one graph-capturable launch.
//
// Grid ceil(M/4) * 16 (block b = tile * 16 + j): CTA (i, j) computes the BF16 logits of tokens [4i, 4i+4) for experts
// [16j, 16j+16) (a 64 KB slice of the 1 MB router weight, so one token still spreads the weight over 16 SMs); the last
// CTA to finish a token tile (an atomic counter per tile, reset by that CTA: replays need no memset) selects the
// tile's top-8. Launched with programmatic dependent launch: every thread waits for the previous kernel (x comes from
// it) and then lets the routed layer's CTAs be scheduled.
//
// Tie rule: experts are ranked by their BF16 logit (equivalently by the exact softmax), ties go to the LOWEST expert
// index (a stable descending sort on the logits in the reference, netra/ops/moe.py moe_route_ref).
// Weights: w_k = exp(l_k - l_max) / sum_{j<8} exp(l_j - l_max).
#include "moe_common.cuh"
#include "moe_sync.cuh"
#include <stddef.h>

#define HIDDEN 2048
#define NUM_EXPERTS 256
#define TOPK 8
#define ROUTE_TILES 16  // expert tiles of 16

struct RouteParams {
  const __nv_bfloat16* x;          // [M, 2048]
  const __nv_bfloat16* w_router;   // [256, 2048]
  __nv_bfloat16* logits;           // [M, 256] scratch
  int* topk_ids;                   // [M, 8] out
  float* topk_w;                   // [M, 8] out
  unsigned* counters;              // [ceil(M/4)] workspace, zeroed once, self-resetting
  int M;
  int _pad;
};

extern "C" __device__ unsigned int netra_params_layout[] = {
    sizeof(RouteParams), offsetof(RouteParams, x), offsetof(RouteParams, w_router), offsetof(RouteParams, logits),
    offsetof(RouteParams, topk_ids), offsetof(RouteParams, topk_w), offsetof(RouteParams, counters),
    offsetof(RouteParams, M)};

namespace {

// Top-8 of one token's 256 BF16 logits by one warp; lane holds experts lane + 32*j.
__device__ void topk_token(const RouteParams& p, int t) {
  const int lane = threadIdx.x & 31;
  float v[8];
#pragma unroll
  for (int j = 0; j < 8; ++j)
    v[j] = __bfloat162float(__ldcg(p.logits + (size_t)t * NUM_EXPERTS + lane + 32 * j));
  float sel_v[TOPK];
  int sel_i[TOPK];
#pragma unroll
  for (int k = 0; k < TOPK; ++k) {
    float bv = -INFINITY;
    int bi = 0x7fffffff;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int idx = lane + 32 * j;
      // strictly greater keeps the lower index (j ascending => idx ascending within a lane)
      if (v[j] > bv || (v[j] == bv && idx < bi)) { bv = v[j]; bi = idx; }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
    }
    sel_v[k] = bv;
    sel_i[k] = bi;
#pragma unroll
    for (int j = 0; j < 8; ++j)
      if (lane + 32 * j == bi) v[j] = -INFINITY;  // removed; -inf logits never reach the top 8 of 256 finite values
  }
  if (lane == 0) {
    float e[TOPK], s = 0.0f;
#pragma unroll
    for (int k = 0; k < TOPK; ++k) { e[k] = expf(sel_v[k] - sel_v[0]); s += e[k]; }
#pragma unroll
    for (int k = 0; k < TOPK; ++k) {
      p.topk_ids[t * TOPK + k] = sel_i[k];
      p.topk_w[t * TOPK + k] = e[k] / s;
    }
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(256) moe_route(const RouteParams p) {
  pdl_wait();
  pdl_trigger();
  __shared__ float xs[4][HIDDEN];  // 32 KB: the tile's 4 token rows in FP32
  __shared__ int last;
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const int tile = blockIdx.x / ROUTE_TILES, etile = blockIdx.x % ROUTE_TILES;
  const int t0 = tile * 4;
  const int nt = min(4, p.M - t0);
  for (int i = tid; i < 4 * HIDDEN / 8; i += blockDim.x) {
    const int r = i / (HIDDEN / 8), c = (i % (HIDDEN / 8)) * 8;
    float f[8];
    if (r < nt) {
      moe::bf16x8_to_float(__ldcg(reinterpret_cast<const uint4*>(p.x + (size_t)(t0 + r) * HIDDEN + c)), f);
    } else {
#pragma unroll
      for (int q = 0; q < 8; ++q) f[q] = 0.0f;
    }
#pragma unroll
    for (int q = 0; q < 8; ++q) xs[r][c + q] = f[q];
  }
  __syncthreads();
  // Each warp: 2 experts; a lane covers 64 columns of a row through 8 x 16-byte loads issued before any use.
  for (int q = 0; q < 2; ++q) {
    const int ex = etile * 16 + wid * 2 + q;
    const __nv_bfloat16* wrow = p.w_router + (size_t)ex * HIDDEN;
    uint4 wv[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) wv[j] = __ldg(reinterpret_cast<const uint4*>(wrow + j * 256 + lane * 8));
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float f[8];
      moe::bf16x8_to_float(wv[j], f);
      const int c = j * 256 + lane * 8;
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int qq = 0; qq < 8; ++qq) acc[r] = fmaf(f[qq], xs[r][c + qq], acc[r]);
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
    }
    if (lane == 0) {
      for (int r = 0; r < nt; ++r) p.logits[(size_t)(t0 + r) * NUM_EXPERTS + ex] = __float2bfloat16_rn(acc[r]);
    }
  }
  // The last CTA of this token tile selects the top-8.
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    const unsigned prev = atomicAdd(&p.counters[tile], 1u);
    last = prev == ROUTE_TILES - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (wid < nt) topk_token(p, t0 + wid);
  if (tid == 0) p.counters[tile] = 0u;
}
