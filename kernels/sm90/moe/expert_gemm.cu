// FP8 block-scaled grouped expert GEMMs for MoE decode (deliverable 3 of issue 7).
//
// moe_gate_up: h[r, :] = bf16( SiLU(x_q[tok] . W13[e, gate rows]) * (x_q[tok] . W13[e, up rows]) )
// moe_down:    y[dst(r), :] = w_r * (h_q[r] . W2[e]);  out[t] = bf16(sum_k y[t*9 + k]) in k order
//
// Weights: E4M3 [E+1, N, K] (K contiguous), FP32 scales [E+1, N/128, K/128]; expert E is the
// shared expert. Activations are quantized to E4M3 per token in groups of 128 INSIDE the GEMM,
// in registers, right where the MMA operand is formed (x for gate_up, h for down), with the same
// arithmetic as the standalone act+quant kernel: the separate quantization launches disappear.
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
#define CHUNK_TILES 4  // token tiles of 8 per pass in moe_down (A stays in registers across passes)
#define GU_TILES 2     // the same for moe_gate_up, whose A fragment already holds 64 registers

struct GemmParams {
  const uint8_t* w13;        // [E+1, 1024, 2048]
  const float* w13_scale;    // [E+1, 8, 16]
  const uint8_t* w2;         // [E+1, 2048, 512]
  const float* w2_scale;     // [E+1, 16, 4]
  const __nv_bfloat16* x;    // [M, 2048]
  __nv_bfloat16* h;          // [M*9, 512] (sorted route order)
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
    offsetof(GemmParams, w2_scale), offsetof(GemmParams, x), offsetof(GemmParams, h), offsetof(GemmParams, y),
    offsetof(GemmParams, out), offsetof(GemmParams, counters), offsetof(GemmParams, num_slots),
    offsetof(GemmParams, slot_expert), offsetof(GemmParams, slot_start), offsetof(GemmParams, route_token),
    offsetof(GemmParams, route_dst), offsetof(GemmParams, route_w), offsetof(GemmParams, M),
    offsetof(GemmParams, routes_per_token)};

#define GU_NTILES (INTER / 16)   // 32 gate_up CTAs per slot (16 gate + 16 up rows each)
#define DN_NTILES (HID / 64)     // 32 down CTAs per slot (64 output rows each)

namespace {

__device__ __forceinline__ void mma_e4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Loads 32 BF16 of a token row (this lane's slice of a K block), quantizes them with the group's
// scale (amax over the 4 lanes t=0..3 of the group = the full 128), returns 8 packed e4m3 words
// and the scale. Invalid (padding) columns give zeros.
__device__ __forceinline__ float quant_operand(const __nv_bfloat16* src, bool valid,
                                               uint32_t (&b)[8]) {
  uint4 v[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    v[i] = valid ? *reinterpret_cast<const uint4*>(src + i * 8) : make_uint4(0u, 0u, 0u, 0u);
  // amax on the raw BF16 (|x| is exact in BF16), then convert once more while packing: keeps
  // 16 registers of payload live instead of 32 floats.
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&v[i]);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(h2[j]);
      amax = fmaxf(amax, fmaxf(fabsf(f.x), fabsf(f.y)));
    }
  }
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
  const float s = moe::group_scale(amax);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&v[i]);
    const float2 f0 = __bfloat1622float2(h2[0]), f1 = __bfloat1622float2(h2[1]);
    const float2 f2 = __bfloat1622float2(h2[2]), f3 = __bfloat1622float2(h2[3]);
    b[2 * i] = moe::quant4(f0.x, f0.y, f1.x, f1.y, s);
    b[2 * i + 1] = moe::quant4(f2.x, f2.y, f3.x, f3.y, s);
  }
  return s;
}

// One K block for one 16-row weight tile and one 8-token tile: 4 MMA steps into a fresh
// fragment, then acc += frag * wscale * token scale (column 2t and 2t+1 of the fragment).
__device__ __forceinline__ void kblock_mma(float (&acc)[4], const uint4 (&a)[4], const uint32_t (&b)[8],
                                           float ws, float s_tok, int t) {
  const uint32_t* lo = reinterpret_cast<const uint32_t*>(&a[0]);  // row g, 32 bytes
  const uint32_t* hi = reinterpret_cast<const uint32_t*>(&a[2]);  // row g + 8
  float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int s = 0; s < 4; ++s) mma_e4m3(d, lo[2 * s], hi[2 * s], lo[2 * s + 1], hi[2 * s + 1], b[2 * s], b[2 * s + 1]);
  const float s0 = __shfl_sync(0xffffffffu, s_tok, (2 * t) * 4);
  const float s1 = __shfl_sync(0xffffffffu, s_tok, (2 * t + 1) * 4);
  acc[0] = fmaf(d[0], ws * s0, acc[0]);
  acc[1] = fmaf(d[1], ws * s1, acc[1]);
  acc[2] = fmaf(d[2], ws * s0, acc[2]);
  acc[3] = fmaf(d[3], ws * s1, acc[3]);
}

__device__ __forceinline__ void load_a(uint4 (&a)[4], const uint8_t* row_g, size_t row_stride) {
  a[0] = *reinterpret_cast<const uint4*>(row_g);
  a[1] = *reinterpret_cast<const uint4*>(row_g + 16);
  a[2] = *reinterpret_cast<const uint4*>(row_g + 8 * row_stride);
  a[3] = *reinterpret_cast<const uint4*>(row_g + 8 * row_stride + 16);
}

// Register-fragment element (row n of 16, column c of 8) -> (lane, register).
__device__ __forceinline__ int frag_lane(int n, int c) { return (n & 7) * 4 + (c >> 1); }
__device__ __forceinline__ int frag_reg(int n, int c) { return (n >> 3) * 2 + (c & 1); }

}  // namespace

// Grid max_slots * 32 (block b: slot b / 32, tile b % 32). Warp w: part = w/4 (0 gate rows, 1 up rows), K blocks [4(w%4), +4).
extern "C" __global__ void __launch_bounds__(256, 2) moe_gate_up(const GemmParams p) {
  __shared__ float red[8][GU_TILES][32][4];  // 8 KB
  const int slot = blockIdx.x / GU_NTILES, ntile = blockIdx.x % GU_NTILES;
  if (slot >= *p.num_slots) return;
  const int e = p.slot_expert[slot];
  const int r0 = p.slot_start[slot];
  const int cnt = p.slot_start[slot + 1] - r0;
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
      const __nv_bfloat16* xrow = p.x + (size_t)tok * HID + t * 32;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t b[8];
        const float st = quant_operand(xrow + (ks * 4 + j) * 128, valid, b);
        kblock_mma(acc[i], a[j], b, ws[j], st, t);
      }
    }
#pragma unroll
    for (int i = 0; i < GU_TILES; ++i)
#pragma unroll
      for (int q = 0; q < 4; ++q) red[wid][i][lane][q] = acc[i][q];
    __syncthreads();
    // Epilogue: 16 intermediate columns x 32 token columns; fixed summation order over K warps.
    for (int idx = tid; idx < 16 * GU_TILES * 8; idx += blockDim.x) {
      const int n = idx & 15, c = idx >> 4;
      if (c0 + c >= cnt) continue;
      const int i = c >> 3, cc = c & 7;
      const int ln = frag_lane(n, cc), rg = frag_reg(n, cc);
      float gsum = 0.0f, usum = 0.0f;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        gsum += red[k][i][ln][rg];
        usum += red[4 + k][i][ln][rg];
      }
      // The deployed boundary: gate_up is rounded to BF16 (SGLang's intermediate cache), then
      // SiLU(gate)*up in FP32 rounded to BF16 again -- exactly act_quant's input and output.
      const float gb = __bfloat162float(__float2bfloat16_rn(gsum));
      const float ub = __bfloat162float(__float2bfloat16_rn(usum));
      p.h[(size_t)(r0 + c0 + c) * INTER + ntile * 16 + n] = __float2bfloat16_rn(moe::silu_mul(gb, ub));
    }
    __syncthreads();
  }
}

// Grid max_slots * 32 (block b: slot b / 32, tile b % 32 of 64 output rows). Warp w: half w/4
// (32 rows = 2 weight tiles of 16), K block w%4 (K = 512 = 4 blocks).
extern "C" __global__ void __launch_bounds__(256, 2) moe_down(const GemmParams p) {
  __shared__ float red[8][2][CHUNK_TILES][32][4];  // 32 KB
  __shared__ int last;
  const int nslots = *p.num_slots;
  const int slot = blockIdx.x / DN_NTILES, ntile = blockIdx.x % DN_NTILES;
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  if (slot < nslots) {
    const int e = p.slot_expert[slot];
    const int r0 = p.slot_start[slot];
    const int cnt = p.slot_start[slot + 1] - r0;
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
        const __nv_bfloat16* hrow = p.h + (size_t)(r0 + (valid ? col : 0)) * INTER + kb * 128 + t * 32;
        uint32_t b[8];
        const float st = quant_operand(hrow, valid, b);
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
  }
  // Top-k reduction: the last CTA of this N tile (over all active slots) sums y in k order.
  if (slot >= nslots) return;
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    const unsigned prev = atomicAdd(&p.counters[ntile], 1u);
    last = prev == (unsigned)nslots - 1u;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int idx = tid; idx < p.M * 64; idx += blockDim.x) {
    const int tk = idx >> 6, n = ntile * 64 + (idx & 63);
    float s = 0.0f;
    for (int k = 0; k < p.routes_per_token; ++k)
      s += __bfloat162float(__ldcg(p.y + (size_t)(tk * ROUTE_STRIDE + k) * HID + n));
    p.out[(size_t)tk * HID + n] = __float2bfloat16_rn(s);
  }
  if (tid == 0) p.counters[ntile] = 0u;
}
