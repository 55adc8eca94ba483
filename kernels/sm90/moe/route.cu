// Routing for the MoE decode path (deliverable 2 of issue 7): router logits, softmax top-8 with
// renormalisation, the shared-expert sigmoid gate, and the route metadata the expert GEMMs
// consume, in ONE graph-capturable launch with no host synchronisation.
//
// Grid ceil(M/4) * 17 (1-D, block b = tile * 17 + j): CTA (i, j<16) computes the BF16 logits of tokens [4i, 4i+4) for experts
// [16j, 16j+16) (a 64 KB slice of the router weight, so M=1 still spreads 1 MB over 16 SMs);
// CTA (i, 16) computes the shared-expert gate logit. The last CTA to finish a token tile (an
// atomic counter per tile) selects that tile's top-8; the last tile to finish builds the metadata
// for all tokens. Counters are reset by their last user, so replays need no memset.
//
// Tie rule: experts are ranked by their BF16 logit (equivalently by the exact softmax), ties go to
// the LOWEST expert index (a stable descending sort on the logits in the reference).
// Weights: w_k = exp(l_k - l_max) / sum_{j<8} exp(l_j - l_max) (the renormalised softmax).
//
// Metadata (route order): active routed experts in increasing id, then the shared expert (id E)
// when enabled; inside an expert, tokens in increasing order. For sorted route r:
// route_token[r], route_dst[r] = token*9 + k (k = rank in the top-8, 8 = shared), route_w[r].
// slot_expert[s], slot_start[s] (s <= num_slots) delimit each expert's routes.
#include "moe_common.cuh"
#include <stddef.h>

#define HIDDEN 2048
#define NUM_EXPERTS 256
#define TOPK 8
#define MAX_TOKENS 128
#define ROUTE_STRIDE 9

struct RouteMeta {
  int* num_slots;     // [1]
  int* slot_expert;   // [NUM_EXPERTS + 1]
  int* slot_start;    // [NUM_EXPERTS + 2]
  int* route_token;   // [M * 9]
  int* route_dst;     // [M * 9]
  float* route_w;     // [M * 9]
};

struct RouteParams {
  const __nv_bfloat16* x;          // [M, 2048]
  const __nv_bfloat16* w_router;   // [256, 2048]
  const __nv_bfloat16* w_shared;   // [2048] shared-expert gate, or null (no shared route)
  __nv_bfloat16* logits;           // [M, 256] out
  __nv_bfloat16* shared_logit;     // [M] out (when w_shared)
  const int* topk_ids_in;          // align-only entry: [M, 8] given ids
  const float* topk_w_in;          // align-only entry: [M, 8] given weights
  int* topk_ids;                   // [M, 8] out
  float* topk_w;                   // [M, 8] out
  float* shared_w;                 // [M] out (sigmoid of the gate logit)
  unsigned* counters;              // [ceil(M/4) + 1] zeroed once, self-resetting
  RouteMeta meta;
  uint8_t* xq;                     // [M, 2048] e4m3 out: x quantized per token group of 128
  float* xs;                       // [M, 16] out: its FP32 scales
  int M;
};

extern "C" __device__ unsigned int netra_params_layout[] = {
    sizeof(RouteParams), offsetof(RouteParams, x), offsetof(RouteParams, w_router),
    offsetof(RouteParams, w_shared), offsetof(RouteParams, logits), offsetof(RouteParams, shared_logit),
    offsetof(RouteParams, topk_ids_in), offsetof(RouteParams, topk_w_in), offsetof(RouteParams, topk_ids),
    offsetof(RouteParams, topk_w), offsetof(RouteParams, shared_w), offsetof(RouteParams, counters),
    offsetof(RouteParams, meta), offsetof(RouteParams, xq), offsetof(RouteParams, xs),
    offsetof(RouteParams, M)};

#define ROUTE_TILES 17  // 16 expert tiles of 16 + the shared-gate tile

namespace {

// Builds the metadata from topk ids/weights (already in global memory) with one 256-thread CTA.
// A per-expert token bitmask gives each route its rank inside its expert with one popc per
// word: deterministic, no sorting, no atomics on positions.
__device__ void build_meta(const RouteParams& p, const int* ids, const float* tw, bool shared) {
  __shared__ unsigned mask[NUM_EXPERTS][MAX_TOKENS / 32];
  __shared__ int start[NUM_EXPERTS + 1];
  __shared__ int warp_tot[8];
  const int tid = threadIdx.x;
  const int M = p.M;
  for (int i = tid; i < NUM_EXPERTS * (MAX_TOKENS / 32); i += blockDim.x) (&mask[0][0])[i] = 0u;
  __syncthreads();
  for (int r = tid; r < M * TOPK; r += blockDim.x) {
    const int e = __ldcg(ids + r);
    const int t = r / TOPK;
    atomicOr(&mask[e][t >> 5], 1u << (t & 31));
  }
  __syncthreads();
  // Exclusive scan of per-expert counts over 256 experts (one per thread).
  int cnt = 0;
  if (tid < NUM_EXPERTS) {
#pragma unroll
    for (int w = 0; w < MAX_TOKENS / 32; ++w) cnt += __popc(mask[tid][w]);
  }
  const int active = cnt > 0 ? 1 : 0;
  int incl = cnt, incl_a = active;
  const int lane = tid & 31, wid = tid >> 5;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, incl, o);
    const int va = __shfl_up_sync(0xffffffffu, incl_a, o);
    if (lane >= o) { incl += v; incl_a += va; }
  }
  __shared__ int warp_tot_a[8];
  if (lane == 31) { warp_tot[wid] = incl; warp_tot_a[wid] = incl_a; }
  __syncthreads();
  int base = 0, base_a = 0;
  for (int w = 0; w < wid; ++w) { base += warp_tot[w]; base_a += warp_tot_a[w]; }
  const int excl = base + incl - cnt;
  const int slot = base_a + incl_a - active;
  int total = 0, total_a = 0;
  for (int w = 0; w < 8; ++w) { total += warp_tot[w]; total_a += warp_tot_a[w]; }
  if (tid < NUM_EXPERTS) {
    start[tid] = excl;
    if (active) {
      p.meta.slot_expert[slot] = tid;
      p.meta.slot_start[slot] = excl;
    }
  }
  if (tid == 0) {
    int ns = total_a;
    if (shared) {
      p.meta.slot_expert[ns] = NUM_EXPERTS;
      p.meta.slot_start[ns] = total;
      ++ns;
    }
    p.meta.slot_start[ns] = total + (shared ? M : 0);
    *p.meta.num_slots = ns;
  }
  __syncthreads();
  for (int r = tid; r < M * TOPK; r += blockDim.x) {
    const int e = __ldcg(ids + r);
    const int t = r / TOPK, k = r % TOPK;
    int rank = 0;
    for (int w = 0; w < (t >> 5); ++w) rank += __popc(mask[e][w]);
    rank += __popc(mask[e][t >> 5] & ((1u << (t & 31)) - 1u));
    const int pos = start[e] + rank;
    p.meta.route_token[pos] = t;
    p.meta.route_dst[pos] = t * ROUTE_STRIDE + k;
    p.meta.route_w[pos] = __ldcg(tw + r);
  }
  if (shared) {
    for (int t = tid; t < M; t += blockDim.x) {
      const int pos = total + t;
      p.meta.route_token[pos] = t;
      p.meta.route_dst[pos] = t * ROUTE_STRIDE + TOPK;
      p.meta.route_w[pos] = __ldcg(p.shared_w + t);
    }
  }
}

// Quantizes tokens [t0, t0+4) of x (the gate_up GEMM's input) once, per group of 128, so that the
// expert GEMM reads E4M3 directly: warp w takes groups w, w+8, ...; a lane holds 4 values.
__device__ void quant_x_tile(const RouteParams& p, int t0) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  const int nt = min(4, p.M - t0);
  for (int gi = wid; gi < nt * (HIDDEN / 128); gi += blockDim.x / 32) {
    const int t = t0 + gi / (HIDDEN / 128), grp = gi % (HIDDEN / 128);
    const __nv_bfloat16* src = p.x + (size_t)t * HIDDEN + grp * 128 + lane * 4;
    float s;
    *reinterpret_cast<uint32_t*>(p.xq + (size_t)t * HIDDEN + grp * 128 + lane * 4) =
        moe::quant_group_warp(*reinterpret_cast<const uint2*>(src), s);
    if (lane == 0) p.xs[t * (HIDDEN / 128) + grp] = s;
  }
}

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

// MOE_PDL=1 (the v3 sequence's builds, launched with programmatic stream serialization): wait for
// the previous kernel first (everything this kernel reads may come from it), then let the
// dependent GEMM's CTAs be scheduled at once (they wait for this grid's completion in their own
// griddepcontrol.wait; triggering after the wait keeps the two-kernels-back argument of
// expert_stream.cu valid). MOE_PDL=0 (v1 builds): no instruction at all.
__device__ __forceinline__ void pdl_enter() {
#if defined(MOE_PDL) && MOE_PDL
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

}  // namespace

extern "C" __global__ void __launch_bounds__(256) moe_route(const RouteParams p) {
  pdl_enter();
  __shared__ float xs[4][HIDDEN];  // 32 KB: the tile's 4 token rows in FP32
  __shared__ int last;
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const int tile = blockIdx.x / ROUTE_TILES, etile = blockIdx.x % ROUTE_TILES;
  const int ntiles = (p.M + 3) / 4;
  const int t0 = tile * 4;
  const int nt = min(4, p.M - t0);
  for (int i = tid; i < 4 * HIDDEN / 8; i += blockDim.x) {
    const int r = i / (HIDDEN / 8), c = (i % (HIDDEN / 8)) * 8;
    float f[8];
    if (r < nt) {
      moe::bf16x8_to_float(*reinterpret_cast<const uint4*>(p.x + (size_t)(t0 + r) * HIDDEN + c), f);
    } else {
#pragma unroll
      for (int q = 0; q < 8; ++q) f[q] = 0.0f;
    }
#pragma unroll
    for (int q = 0; q < 8; ++q) xs[r][c + q] = f[q];
  }
  __syncthreads();
  const bool gate_tile = etile == NUM_EXPERTS / 16;
  if (gate_tile) quant_x_tile(p, t0);
  if (!gate_tile || p.w_shared != nullptr) {
    // Each warp: 2 experts (or, in the gate tile, warp 0 the shared gate row); lane covers
    // 64 columns of a row through 8 x 16-byte loads issued before any use.
    const int rows = gate_tile ? 1 : 2;
    for (int q = 0; q < rows; ++q) {
      if (gate_tile && wid != 0) break;
      const int ex = etile * 16 + wid * 2 + q;
      const __nv_bfloat16* wrow = gate_tile ? p.w_shared : p.w_router + (size_t)ex * HIDDEN;
      uint4 wv[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) wv[j] = *reinterpret_cast<const uint4*>(wrow + j * 256 + lane * 8);
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
        for (int r = 0; r < nt; ++r) {
          const __nv_bfloat16 lb = __float2bfloat16_rn(acc[r]);
          if (gate_tile) {
            p.shared_logit[t0 + r] = lb;
            p.shared_w[t0 + r] = 1.0f / (1.0f + expf(-__bfloat162float(lb)));
          } else {
            p.logits[(size_t)(t0 + r) * NUM_EXPERTS + ex] = lb;
          }
        }
      }
    }
  }
  // Last CTA of this token tile selects the top-8; last tile builds the metadata.
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
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    p.counters[tile] = 0u;
    const unsigned prev = atomicAdd(&p.counters[ntiles], 1u);
    last = prev == (unsigned)ntiles - 1u;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  build_meta(p, p.topk_ids, p.topk_w, p.w_shared != nullptr);
  if (tid == 0) p.counters[ntiles] = 0u;
}

// Align-only entry (the routed comparison against SGLang, whose pipeline starts from given
// top-k ids and weights). Grid 1 + ceil(M/4): CTA 0 builds the metadata (no shared route unless
// shared_w is given); CTA 1 + i quantizes tokens [4i, 4i+4) of x for the gate_up GEMM.
extern "C" __global__ void __launch_bounds__(256) moe_align(const RouteParams p) {
  pdl_enter();
  if (blockIdx.x == 0) {
    build_meta(p, p.topk_ids_in, p.topk_w_in, p.shared_w != nullptr);
  } else {
    quant_x_tile(p, (blockIdx.x - 1) * 4);
  }
}
