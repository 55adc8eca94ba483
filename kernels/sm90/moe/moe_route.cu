// MoE routing for 1..128 tokens, the first step of the block plans (moe_block_t1, moe_block_stream): router logits
// (BF16), top-8 by logit with ties to the lowest expert index, the weights renormalised over the 8 (softmax restricted
// to the top 8), and the shared expert as a 9th route: topk_ids[t, 8] = 256, topk_w[t, 8] = sigmoid(bf16(x . w_gate))
// (the 257th router row); at ONE token also the shared expert's gate_up. One graph-capturable launch.
//
// Grid cdiv(M, 4) * 17 + (M == 1 ? 64 : 0), 256 threads:
//   * block b < tiles * 16 (b = tile * 16 + j): the BF16 logits of tokens [4 tile, +4) for experts [16 j, 16 j + 16) (a
//     64 KB slice of the 1 MB router weight, so one token still spreads the weight over 16 SMs); the last CTA to finish
//     a token tile (an atomic counter per tile, reset by that CTA: replays need no memset) selects the tile's top-8;
//   * block tiles * 16 + tile: the tile's shared-gate logits (the same dot-product arithmetic as a router row) and the
//     9th route of its tokens;
//   * block tiles * 17 + i, i < 64 (M == 1 only): h of the shared expert's columns [8 i, 8 i + 8) for token 0, written to
//     h_shared [512] BF16, with moe_layer_t1's arithmetic (x quantized per 128, the m16n8k32 e4m3 core, the scaled FP32
//     chain over K blocks in order, gate / up rounded to BF16, bf16(SiLU(gate) * up)); moe_layer_t1 then runs only the
//     shared route's down GEMM (both GEMMs of the shared expert at one token depend on x alone: the gate_up runs here,
//     beside the router, on SMs the routing leaves idle).
// Launched with programmatic dependent launch: every thread waits for the previous kernel (x comes from it) and then
// lets the routed layer's CTAs be scheduled.
//
// Tie rule: experts are ranked by their BF16 logit (equivalently by the exact softmax), ties go to the LOWEST expert
// index (a stable descending sort on the logits in the reference, netra/ops/moe.py moe_route_ref).
// Weights: w_k = exp(l_k - l_max) / sum_{j<8} exp(l_j - l_max); the shared route's 1 / (1 + exp(-l_s)).
#include "moe_common.cuh"
#include "moe_sync.cuh"
#include <stddef.h>

#define HIDDEN 2048
#define NUM_EXPERTS 256
#define TOPK 8
#define ROUTES 9        // topk_ids / topk_w row stride: 8 routed ranks + the shared expert
#define SHARED_ID 256   // the shared expert's id in topk_ids
#define ROUTE_TILES 16  // expert tiles of 16
#define GU_CTAS 64      // one-token shared gate_up: 8 columns per CTA

struct RouteParams {
  const __nv_bfloat16* x;          // [M, 2048]
  const __nv_bfloat16* w_router;   // [256, 2048]
  __nv_bfloat16* logits;           // [M, 256] scratch
  int* topk_ids;                   // [M, 9] out (8 routed ranks, then the shared expert)
  float* topk_w;                   // [M, 9] out
  unsigned* counters;              // [ceil(M/4)] workspace, zeroed once, self-resetting
  const __nv_bfloat16* w_gate;     // [2048] the shared-expert gate row
  const uint8_t* sw13;             // [1024, 2048] e4m3: the shared expert's gate / up rows (M == 1)
  const float* sw13_scale;         // [8, 16]
  __nv_bfloat16* h_shared;         // [512] out (M == 1): h of the shared expert for token 0
  int M;
  int _pad;
};

extern "C" __device__ unsigned int netra_params_layout[] = {
    sizeof(RouteParams), offsetof(RouteParams, x), offsetof(RouteParams, w_router), offsetof(RouteParams, logits),
    offsetof(RouteParams, topk_ids), offsetof(RouteParams, topk_w), offsetof(RouteParams, counters),
    offsetof(RouteParams, w_gate), offsetof(RouteParams, sw13), offsetof(RouteParams, sw13_scale),
    offsetof(RouteParams, h_shared), offsetof(RouteParams, M)};

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
      p.topk_ids[t * ROUTES + k] = sel_i[k];
      p.topk_w[t * ROUTES + k] = e[k] / s;
    }
  }
}

// One weight row (2048 BF16) against the tile's 4 token rows in FP32: each lane covers 64 columns through 8 x 16-byte
// loads issued before any use; acc[r] is the full dot product of token r in every lane (xor reduction).
__device__ __forceinline__ void row_dot4(const __nv_bfloat16* wrow, const float (*xs)[HIDDEN], int lane, float (&acc)[4]) {
  uint4 wv[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) wv[j] = __ldg(reinterpret_cast<const uint4*>(wrow + j * 256 + lane * 8));
#pragma unroll
  for (int r = 0; r < 4; ++r) acc[r] = 0.0f;
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
}

// One token's shared-expert h for columns [8 i, 8 i + 8) (moe_layer_t1's gate_up tile and arithmetic): warp w quantizes
// x groups 2w, 2w + 1 and runs K blocks 2w, 2w + 1 of the 16-row tile (rows g: gate row 8 i + g, rows g + 8: up row
// 512 + 8 i + g, read straight from global memory), parks the raw fragments in shared memory; warp 0 then runs the
// scaled FP32 chain over K blocks 0..15 in order and writes h = bf16(SiLU(bf16 gate) * bf16 up).
__device__ __forceinline__ void shared_gate_up(const RouteParams& p, int i, uint8_t* sm) {
  uint8_t* s_xq = sm;                                        // [2048] E4M3
  float* s_xs = reinterpret_cast<float*>(sm + HIDDEN);       // [16]
  float4* s_d = reinterpret_cast<float4*>(sm + HIDDEN + 64); // [16 kb][32 lanes]
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const bool valid = g == 0;
  uint4 a[2][4];
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {  // the weights first (the latency to hide), then x
    const int kb = 2 * wid + h2;
    const uint8_t* gr = p.sw13 + (size_t)(8 * i + g) * HIDDEN + kb * 128 + t4 * 32;
    const uint8_t* ur = p.sw13 + (size_t)(512 + 8 * i + g) * HIDDEN + kb * 128 + t4 * 32;
    a[h2][0] = __ldg(reinterpret_cast<const uint4*>(gr));
    a[h2][1] = __ldg(reinterpret_cast<const uint4*>(gr + 16));
    a[h2][2] = __ldg(reinterpret_cast<const uint4*>(ur));
    a[h2][3] = __ldg(reinterpret_cast<const uint4*>(ur + 16));
  }
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    const int grp = 2 * wid + h2;
    const uint2 xr = __ldcg(reinterpret_cast<const uint2*>(p.x) + grp * 32 + lane);
    float sc;
    *reinterpret_cast<uint32_t*>(s_xq + grp * 128 + lane * 4) = moe::quant_group_warp(xr, sc);
    if (lane == 0) s_xs[grp] = sc;
  }
  __syncwarp();  // this warp's x_q groups are its own K blocks
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    const int kb = 2 * wid + h2;
    uint32_t bf[8];
    moe::load_b(s_xq + kb * 128 + t4 * 32, valid, bf);
    float d[4];
    moe::kblock_d(d, a[h2], bf);
    s_d[kb * 32 + lane] = make_float4(d[0], d[1], d[2], d[3]);
  }
  __syncthreads();
  if (wid != 0) return;
  const float* wsg = p.sw13_scale + (i >> 4) * 16;        // the gate rows' 128-row block
  const float* wsu = p.sw13_scale + (4 + (i >> 4)) * 16;  // the up rows'
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int kb = 0; kb < 16; ++kb) {
    const float4 v = s_d[kb * 32 + lane];
    const float d[4] = {v.x, v.y, v.z, v.w};
    moe::kblock_acc2(acc, d, __ldg(wsg + kb), __ldg(wsu + kb), valid ? s_xs[kb] : 0.0f, t4);
  }
  if (t4 == 0) {  // token column 0: acc[0] gate (row g), acc[2] up (row g + 8) of column 8 i + g
    const float gt = __bfloat162float(__float2bfloat16_rn(acc[0]));
    const float up = __bfloat162float(__float2bfloat16_rn(acc[2]));
    p.h_shared[8 * i + g] = __float2bfloat16_rn(moe::silu_mul(gt, up));
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(256) moe_route(const RouteParams p) {
  pdl_wait();
  pdl_trigger();
  __shared__ __align__(16) float xs[4][HIDDEN];  // 32 KB: the tile's 4 token rows in FP32 (gate_up CTAs: x_q, fragments)
  __shared__ int last;
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const int tiles = (p.M + 3) / 4;
  if ((int)blockIdx.x >= tiles * (ROUTE_TILES + 1)) {  // the one-token shared gate_up
    const int i = blockIdx.x - tiles * (ROUTE_TILES + 1);
    if (p.M != 1 || i >= GU_CTAS) __trap();  // the grid rule: 64 of them at M == 1 only
    shared_gate_up(p, i, reinterpret_cast<uint8_t*>(&xs[0][0]));
    return;
  }
  const bool gate_cta = (int)blockIdx.x >= tiles * ROUTE_TILES;
  const int tile = gate_cta ? blockIdx.x - tiles * ROUTE_TILES : blockIdx.x / ROUTE_TILES, etile = blockIdx.x % ROUTE_TILES;
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
  if (gate_cta) {  // the 257th row: the shared-gate logit (BF16) -> the 9th route
    if (wid == 0) {
      float acc[4];
      row_dot4(p.w_gate, xs, lane, acc);
      if (lane < nt) {
        const float l = __bfloat162float(__float2bfloat16_rn(acc[lane]));
        p.topk_ids[(t0 + lane) * ROUTES + TOPK] = SHARED_ID;
        p.topk_w[(t0 + lane) * ROUTES + TOPK] = 1.0f / (1.0f + expf(-l));
      }
    }
    return;
  }
  // Each warp: 2 experts
  for (int q = 0; q < 2; ++q) {
    const int ex = etile * 16 + wid * 2 + q;
    float acc[4];
    row_dot4(p.w_router + (size_t)ex * HIDDEN, xs, lane, acc);
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
