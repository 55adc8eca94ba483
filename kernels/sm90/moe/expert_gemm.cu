// FP8 block-scaled grouped expert GEMMs for MoE decode (deliverable 3 of issue 7).
//
// moe_gate_up: gu[r, :] = bf16(x_q[tok] . W13[e])                  (BF16 gate | up, route order)
// moe_act_quant (act_quant.cu) then gives h_q, h_s = quant(bf16(SiLU(gate) * up))
// moe_down:    y[dst(r), :] = bf16(w_r * (h_q[r] . W2[e]));  out[t] = bf16(sum_k y[t*9 + k]) in k order
//
// Weights: E4M3 [E+1, N, K] (K contiguous), FP32 scales [E+1, N/128, K/128]; expert E is the
// shared expert. Activations arrive quantized (x by moe_route / moe_align, h by moe_act_quant),
// once per token: an earlier version quantized them inside every CTA, which made the GEMMs
// instruction-bound (ncu, H200: 43% SM throughput, 10-12% DRAM throughput; results/sm90/moe_runs/run2).
//
// MMA: mma.sync m16n8k32 e4m3 with swapped operands: the 16-row side is a weight tile, the 8-wide
// side is up to 8 tokens of one expert (decode experts see 1..16 tokens, so a 16-row token tile
// would be mostly padding). Inside each 128-wide K block the K order is permuted so that every
// lane reads 32 contiguous bytes (two 16-byte loads) of a weight row and the same 32 bytes of its
// token: lane (g, t) feeds logical k {4t..4t+3} of MMA step s from bytes t*32 + 8s + [0, 4) and
// logical k {16+4t..} from t*32 + 8s + [4, 8) on BOTH operands, so the dot product is unchanged.
// Per K block the 4 MMA steps accumulate in a fresh FP32 fragment, which is then scaled by
// (weight block scale * token group scale) and added to the running FP32 accumulator.
//
// Work: CTA = (slot = active expert, N tile); 8 warps split K; partial sums meet in shared memory
// and are added in a fixed warp order (deterministic). moe_down reduces the top-k contributions
// itself: the last CTA to finish an N tile (an atomic counter per tile, reset by that CTA) sums
// y over k in fixed order for every token of that tile.
#include "moe_common.cuh"
#include <stddef.h>

#define HID 2048
#define INTER 512
#define MAX_SLOTS 257
#define ROUTE_STRIDE 9
#define CHUNK_TILES 2  // token tiles of 8 per pass in moe_down (A stays in registers across passes)
#define GU_TILES 1     // token tiles per pass in moe_gate_up (its A fragment already holds 64 registers)

struct GemmParams {
  const uint8_t* w13;        // [E+1, 1024, 2048]
  const float* w13_scale;    // [E+1, 8, 16]
  const uint8_t* w2;         // [E+1, 2048, 512]
  const float* w2_scale;     // [E+1, 16, 4]
  const uint8_t* xq;         // [M, 2048] e4m3 (quantized once by moe_route / moe_align)
  const float* xs;           // [M, 16]
  __nv_bfloat16* gu;         // [M*9, 1024] BF16 gate | up, sorted route order (moe_gate_up out)
  const uint8_t* hq;         // [M*9, 512] e4m3 SiLU(gate)*up (moe_act_quant out)
  const float* hs;           // [M*9, 4]
  __nv_bfloat16* y;          // [M*9, 2048] BF16 per-route contributions (row token*9 + k)
  __nv_bfloat16* out;        // [M, 2048]
  unsigned* counters;        // [32] zeroed once, self-resetting (moe_down)
  const int* num_slots;
  const int* slot_expert;
  const int* slot_start;
  const int* route_token;
  const int* route_dst;
  const float* route_w;
  int M;
  int routes_per_token;      // 8 (routed only) or 9 (shared expert as a ninth route)
};

extern "C" __device__ unsigned int netra_params_layout[] = {
    sizeof(GemmParams), offsetof(GemmParams, w13), offsetof(GemmParams, w13_scale), offsetof(GemmParams, w2),
    offsetof(GemmParams, w2_scale), offsetof(GemmParams, xq), offsetof(GemmParams, xs), offsetof(GemmParams, gu),
    offsetof(GemmParams, hq), offsetof(GemmParams, hs), offsetof(GemmParams, y), offsetof(GemmParams, out),
    offsetof(GemmParams, counters), offsetof(GemmParams, num_slots), offsetof(GemmParams, slot_expert),
    offsetof(GemmParams, slot_start), offsetof(GemmParams, route_token), offsetof(GemmParams, route_dst),
    offsetof(GemmParams, route_w), offsetof(GemmParams, M), offsetof(GemmParams, routes_per_token)};

#define GU_NTILES (INTER / 16)   // 32 gate_up CTAs per slot (16 gate + 16 up rows each)
#define DN_NTILES (HID / 64)     // 32 down CTAs per slot (64 output rows each)

namespace {

// The MMA core (mma_e4m3, load_b, kblock_mma, load_a) lives in moe_common.cuh, shared with v3 and the
// one-token kernel.
using moe::kblock_mma;
using moe::load_a;
using moe::load_b;

// Register-fragment element (row n of 16, column c of 8) -> (lane, register).
__device__ __forceinline__ int frag_lane(int n, int c) { return (n & 7) * 4 + (c >> 1); }
__device__ __forceinline__ int frag_reg(int n, int c) { return (n >> 3) * 2 + (c & 1); }

}  // namespace

// Grid max_slots * 32 (block b: slot b / 32, tile b % 32). Warp w: part = w/4 (0 gate rows, 1 up
// rows), K blocks [4(w%4), +4). The 16 A loads of a thread (64 KB per CTA) are issued before
// anything else; the slot lookup is one dependent hop (all four metadata words load together).
extern "C" __global__ void __launch_bounds__(256, 2) moe_gate_up(const GemmParams p) {
  __shared__ float red[8][GU_TILES][32][4];
  const int slot = blockIdx.x / GU_NTILES, ntile = blockIdx.x % GU_NTILES;
  const int nslots = *p.num_slots, e = p.slot_expert[slot];
  const int r0 = p.slot_start[slot], r1 = p.slot_start[slot + 1];
  if (slot >= nslots) return;
  const int cnt = r1 - r0;
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int part = wid >> 2, ks = wid & 3;
  const int n0 = part * INTER + ntile * 16;
  const uint8_t* wbase = p.w13 + ((size_t)e * 1024 + n0 + g) * HID + t * 32;
  uint4 a[4][4];
  float ws[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int kb = ks * 4 + j;
    load_a(a[j], wbase + kb * 128, HID);
    ws[j] = p.w13_scale[((size_t)e * 8 + n0 / 128) * 16 + kb];
  }
  for (int c0 = 0; c0 < cnt; c0 += GU_TILES * 8) {
    float acc[GU_TILES][4];
#pragma unroll
    for (int i = 0; i < GU_TILES; ++i)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][q] = 0.0f;
#pragma unroll
    for (int i = 0; i < GU_TILES; ++i) {
      if (c0 + i * 8 >= cnt) break;  // warp-uniform
      const int col = c0 + i * 8 + g;
      const bool valid = col < cnt;
      const int tok = valid ? p.route_token[r0 + col] : 0;
      const uint8_t* xrow = p.xq + (size_t)tok * HID + t * 32;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t b[8];
        load_b(xrow + (ks * 4 + j) * 128, valid, b);
        const float st = valid ? p.xs[tok * (HID / 128) + ks * 4 + j] : 0.0f;
        kblock_mma(acc[i], a[j], b, ws[j], st, t);
      }
    }
#pragma unroll
    for (int i = 0; i < GU_TILES; ++i)
#pragma unroll
      for (int q = 0; q < 4; ++q) red[wid][i][lane][q] = acc[i][q];
    __syncthreads();
    // Epilogue: 16 gate + 16 up columns x 8*GU_TILES tokens; fixed summation order over K warps;
    // written as the BF16 gate_up cache that moe_act_quant consumes.
    for (int idx = tid; idx < 2 * 16 * GU_TILES * 8; idx += blockDim.x) {
      const int n = idx & 15, c = (idx >> 4) % (GU_TILES * 8), pt = idx / (16 * GU_TILES * 8);
      if (c0 + c >= cnt) continue;
      const int i = c >> 3, cc = c & 7;
      const int ln = frag_lane(n, cc), rg = frag_reg(n, cc);
      float v = 0.0f;
#pragma unroll
      for (int k = 0; k < 4; ++k) v += red[pt * 4 + k][i][ln][rg];
      p.gu[(size_t)(r0 + c0 + c) * 1024 + pt * INTER + ntile * 16 + n] = __float2bfloat16_rn(v);
    }
    __syncthreads();
  }
}

// Grid max_slots * 32 (block b: slot b / 32, tile b % 32 of 64 output rows). Warp w: half w/4
// (32 rows = 2 weight tiles of 16), K block w%4 (K = 512 = 4 blocks).
extern "C" __global__ void __launch_bounds__(256, 2) moe_down(const GemmParams p) {
  __shared__ float red[8][2][CHUNK_TILES][32][4];  // 16 KB
  __shared__ int last;
  const int slot = blockIdx.x / DN_NTILES, ntile = blockIdx.x % DN_NTILES;
  const int nslots = *p.num_slots, e = p.slot_expert[slot];
  const int r0 = p.slot_start[slot], r1 = p.slot_start[slot + 1];
  if (slot >= nslots) return;
  const int cnt = r1 - r0;
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int half = wid >> 2, kb = wid & 3;
  const int nb = ntile * 64 + half * 32;  // this warp's 32 rows = 2 tiles of 16
  uint4 a[2][4];
  float ws[2];
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    const int n0 = nb + q * 16;
    load_a(a[q], p.w2 + ((size_t)e * HID + n0 + g) * INTER + kb * 128 + t * 32, INTER);
    ws[q] = p.w2_scale[((size_t)e * 16 + n0 / 128) * 4 + kb];
  }
  for (int c0 = 0; c0 < cnt; c0 += CHUNK_TILES * 8) {
    float acc[2][CHUNK_TILES][4];
#pragma unroll
    for (int q = 0; q < 2; ++q)
#pragma unroll
      for (int i = 0; i < CHUNK_TILES; ++i)
#pragma unroll
        for (int z = 0; z < 4; ++z) acc[q][i][z] = 0.0f;
#pragma unroll
    for (int i = 0; i < CHUNK_TILES; ++i) {
      if (c0 + i * 8 >= cnt) break;
      const int col = c0 + i * 8 + g;
      const bool valid = col < cnt;
      const int r = r0 + (valid ? col : 0);
      uint32_t b[8];
      load_b(p.hq + (size_t)r * INTER + kb * 128 + t * 32, valid, b);
      const float st = valid ? p.hs[r * 4 + kb] : 0.0f;
#pragma unroll
      for (int q = 0; q < 2; ++q) kblock_mma(acc[q][i], a[q], b, ws[q], st, t);
    }
#pragma unroll
    for (int q = 0; q < 2; ++q)
#pragma unroll
      for (int i = 0; i < CHUNK_TILES; ++i)
#pragma unroll
        for (int z = 0; z < 4; ++z) red[wid][q][i][lane][z] = acc[q][i][z];
    __syncthreads();
    // 64 output columns x 32 token columns; fixed order over the 4 K warps.
    for (int idx = tid; idx < 64 * CHUNK_TILES * 8; idx += blockDim.x) {
      const int n = idx & 63, c = idx >> 6;
      if (c0 + c >= cnt) continue;
      const int hf = n >> 5, q = (n >> 4) & 1, nn = n & 15;
      const int i = c >> 3, cc = c & 7;
      const int ln = frag_lane(nn, cc), rg = frag_reg(nn, cc);
      float v = 0.0f;
#pragma unroll
      for (int k = 0; k < 4; ++k) v += red[hf * 4 + k][q][i][ln][rg];
      const int r = r0 + c0 + c;
      // Each route's contribution is weighted in FP32 and rounded to BF16 (the engine's
      // reference and SGLang's intermediate cache do the same), then summed in FP32.
      p.y[(size_t)p.route_dst[r] * HID + ntile * 64 + n] = __float2bfloat16_rn(v * p.route_w[r]);
    }
    __syncthreads();
  }
  // Top-k reduction: the last CTA of this N tile (over all active slots) sums y in k order,
  // 8 columns (one 16-byte load per route) per thread and step.
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    const unsigned prev = atomicAdd(&p.counters[ntile], 1u);
    last = prev == (unsigned)nslots - 1u;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int idx = tid; idx < p.M * 8; idx += blockDim.x) {
    const int tk = idx >> 3, n = ntile * 64 + (idx & 7) * 8;
    float s[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int k = 0; k < p.routes_per_token; ++k) {
      const uint4 v = __ldcg(reinterpret_cast<const uint4*>(p.y + (size_t)(tk * ROUTE_STRIDE + k) * HID + n));
      float f[8];
      moe::bf16x8_to_float(v, f);
#pragma unroll
      for (int z = 0; z < 8; ++z) s[z] += f[z];
    }
    uint4 o;
    __nv_bfloat162* o2 = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
    for (int z = 0; z < 4; ++z) o2[z] = __floats2bfloat162_rn(s[2 * z], s[2 * z + 1]);
    *reinterpret_cast<uint4*>(p.out + (size_t)tk * HID + n) = o;
  }
  if (tid == 0) p.counters[ntile] = 0u;
}
