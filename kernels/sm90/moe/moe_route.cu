// MoE routing for 1..128 tokens, the first step of the block plans (moe_block_t1, moe_block_stream): router logits
// (BF16), top-8 by logit with ties to the lowest expert index, the weights renormalised over the 8 (softmax restricted
// to the top 8), and the shared expert as a 9th route: topk_ids[t, 8] = 256, topk_w[t, 8] = sigmoid(bf16(x . w_gate))
// (the 257th router row); at ONE token also the shared expert's gate_up. One graph-capturable launch.
//
// Grid 16 cdiv(M, 8) + cdiv(M, 32) + (M == 1 ? 64 : 0), 256 threads; every CTA requests its constant weights (router /
// gate / shared-expert rows) into registers BEFORE waiting for the previous kernel, so a CTA scheduled early (beside
// the previous kernel) has them in hand when x arrives:
//   * block b < 16 cdiv(M, 8), b = group * 16 + j: the BF16 logits of tokens [8 group, +8) for experts [16 j, 16 j + 16);
//     block 16 cdiv(M, 8) + q: the shared-gate logits (the 257th row) of tokens [32 q, +32) and their 9th route.
//     Tensor cores: mma.sync m16n8k16 BF16 -> FP32 (16 weight rows x 8 tokens per n-tile, exact products, FP32 sums), warp w takes K columns
//     [256 w, 256 w + 256) (lane t reads 32 contiguous bytes of its row / token per 64 columns: a K permutation applied
//     to both operands), the 8 warps' partial sums are added in warp order in shared memory and rounded once to BF16
//     (an FP32 dot product in another order than the reference's: a different BF16 rounding is a near-tie, which
//     routing_agreement tells from an error); the last of a group's 16 logit CTAs (an atomic counter per group, reset
//     by that CTA: replays need no memset) selects the group's top-8 (a warp per token). At 128 tokens that is 260
//     CTAs, two per SM: one wave;
//   * the last 64 blocks (M == 1 only), i < 64: h of the shared expert's columns [8 i, 8 i + 8) for token 0, written to
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
#define GROUP 8         // tokens per logit CTA (one n-tile)
#define GATE_GROUP 32   // tokens per shared-gate CTA (4 n-tiles)
#define GU_CTAS 64      // one-token shared gate_up: 8 columns per CTA

struct RouteParams {
  const __nv_bfloat16* x;          // [M, 2048]
  const __nv_bfloat16* w_router;   // [256, 2048]
  __nv_bfloat16* logits;           // [M, 256] scratch
  int* topk_ids;                   // [M, 9] out (8 routed ranks, then the shared expert)
  float* topk_w;                   // [M, 9] out
  unsigned* counters;              // [ceil(M/32)] workspace, zeroed once, self-resetting
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

__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// 32 bytes (16 BF16) of a row at column col, as 8 words; a null row gives zeros
__device__ __forceinline__ void load16(const __nv_bfloat16* row, int col, uint32_t (&w)[8], bool cg) {
  uint4 v0 = make_uint4(0u, 0u, 0u, 0u), v1 = v0;
  if (row != nullptr) {
    const uint4* q = reinterpret_cast<const uint4*>(row + col);
    v0 = cg ? __ldcg(q) : __ldg(q);
    v1 = cg ? __ldcg(q + 1) : __ldg(q + 1);
  }
  w[0] = v0.x; w[1] = v0.y; w[2] = v0.z; w[3] = v0.w;
  w[4] = v1.x; w[5] = v1.y; w[6] = v1.z; w[7] = v1.w;
}

// The logits of one group's tokens for 16 weight rows (j < 16: experts 16 j + r; j == 16: row 0 the shared gate, the
// others zero), then (j < 16) the group's top-8 by its last CTA, or (j == 16) the group's 9th route.
// ntiles n-tiles of 8 tokens from t0; grp: the top-8 group's counter (j < 16)
__device__ __forceinline__ void route_logits(const RouteParams& p, int t0, int ntiles, int grp, int j,
                                             float (*red)[4][32][4], int* last) {
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5, g = lane >> 2, t = lane & 3;
  // A fragments: rows g and g + 8, this warp's 4 blocks of 64 columns, lane t's 16 columns of each (before the wait)
  const __nv_bfloat16* r0 = j < ROUTE_TILES ? p.w_router + (size_t)(16 * j + g) * HIDDEN : (g == 0 ? p.w_gate : nullptr);
  const __nv_bfloat16* r1 = j < ROUTE_TILES ? p.w_router + (size_t)(16 * j + g + 8) * HIDDEN : nullptr;
  uint32_t wa[4][8], wb[4][8];
#pragma unroll
  for (int blk = 0; blk < 4; ++blk) {
    const int col = 256 * wid + 64 * blk + 16 * t;
    load16(r0, col, wa[blk], false);
    load16(r1, col, wb[blk], false);
  }
  pdl_wait();
  pdl_trigger();
#pragma unroll 1
  for (int nt = 0; nt < ntiles; ++nt) {
    if (t0 + nt * 8 >= p.M) break;
    const int tok = t0 + nt * 8 + g;
    const __nv_bfloat16* xr = tok < p.M ? p.x + (size_t)tok * HIDDEN : nullptr;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int blk = 0; blk < 4; ++blk) {
      uint32_t xb[8];
      load16(xr, 256 * wid + 64 * blk + 16 * t, xb, true);
      // k-step s: lane t's k slots {2t, 2t+1} = its columns 4s, 4s+1 and {2t+8, 2t+9} = 4s+2, 4s+3 (same map in A and B)
#pragma unroll
      for (int s = 0; s < 4; ++s)
        mma_bf16(acc, wa[blk][2 * s], wb[blk][2 * s], wa[blk][2 * s + 1], wb[blk][2 * s + 1], xb[2 * s], xb[2 * s + 1]);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) red[wid][nt][lane][i] = acc[i];
  }
  __syncthreads();
  {  // thread -> (n-tile, fragment lane, row half): the 8 warps' partial sums in warp order, rounded once
    const int nt = tid >> 6, fl = (tid >> 1) & 31, h = tid & 1;
    const int row = (fl >> 2) + 8 * h;
    if (nt < ntiles && t0 + nt * 8 < p.M && (j < ROUTE_TILES || row == 0)) {
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < 8; ++w) sum += red[w][nt][fl][2 * h + q];
        const int tok = t0 + nt * 8 + 2 * (fl & 3) + q;
        if (tok < p.M) {
          if (j < ROUTE_TILES) {
            p.logits[(size_t)tok * NUM_EXPERTS + 16 * j + row] = __float2bfloat16_rn(sum);
          } else {  // the shared gate: route 8 of the token
            const float l = __bfloat162float(__float2bfloat16_rn(sum));
            p.topk_ids[tok * ROUTES + TOPK] = SHARED_ID;
            p.topk_w[tok * ROUTES + TOPK] = 1.0f / (1.0f + expf(-l));
          }
        }
      }
    }
  }
  if (j == ROUTE_TILES) return;
  // The last CTA of this token group selects the top-8.
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    const unsigned prev = atomicAdd(&p.counters[grp], 1u);
    *last = prev == ROUTE_TILES - 1;
  }
  __syncthreads();
  if (!*last) return;
  __threadfence();
  for (int tt = wid; tt < GROUP && t0 + tt < p.M; tt += 8) topk_token(p, t0 + tt);
  if (tid == 0) p.counters[grp] = 0u;
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
  for (int h2 = 0; h2 < 2; ++h2) {  // the weights before the wait (constant), then x
    const int kb = 2 * wid + h2;
    const uint8_t* gr = p.sw13 + (size_t)(8 * i + g) * HIDDEN + kb * 128 + t4 * 32;
    const uint8_t* ur = p.sw13 + (size_t)(512 + 8 * i + g) * HIDDEN + kb * 128 + t4 * 32;
    a[h2][0] = __ldg(reinterpret_cast<const uint4*>(gr));
    a[h2][1] = __ldg(reinterpret_cast<const uint4*>(gr + 16));
    a[h2][2] = __ldg(reinterpret_cast<const uint4*>(ur));
    a[h2][3] = __ldg(reinterpret_cast<const uint4*>(ur + 16));
  }
  pdl_wait();
  pdl_trigger();
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
  __shared__ __align__(16) float red[8][GATE_GROUP / 8][32][4];  // 16 KB: the warps' partial sums (gate_up CTAs: x_q,
                                                                 // fragments)
  __shared__ int last;
  const int b = blockIdx.x;
  const int nlog = ROUTE_TILES * ((p.M + GROUP - 1) / GROUP), ngate = (p.M + GATE_GROUP - 1) / GATE_GROUP;
  if (b < nlog) {
    route_logits(p, (b / ROUTE_TILES) * GROUP, 1, b / ROUTE_TILES, b % ROUTE_TILES, red, &last);
  } else if (b < nlog + ngate) {
    route_logits(p, (b - nlog) * GATE_GROUP, GATE_GROUP / 8, 0, ROUTE_TILES, red, &last);
  } else {  // the one-token shared gate_up
    const int i = b - nlog - ngate;
    if (p.M != 1 || i >= GU_CTAS) __trap();  // the grid rule: 64 of them at M == 1 only
    shared_gate_up(p, i, reinterpret_cast<uint8_t*>(&red[0][0][0][0]));
  }
}
