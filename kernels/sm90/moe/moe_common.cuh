// Shared device helpers for the sm90 MoE decode family (act+quant, routing, FP8 expert GEMMs).
//
// Numerics (netra/ops/moe_fp8.py is the oracle):
//   * group quantization: amax over a group of 128 values, scale = max(amax, 1e-10) / 448 (IEEE
//     division), q = e4m3(clamp(v / scale, -448, 448)) rounded to nearest even.
//   * SiLU(g)*u in FP32: g / (1 + expf(-g)) * u, rounded once to BF16 (PyTorch's own CUDA SiLU
//     formula, so the kernel is bitwise equal to the two-step torch reference on the GPU).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#define MOE_FP8_MAX 448.0f
#define MOE_AMAX_EPS 1e-10f

namespace moe {

__device__ __forceinline__ float silu_mul(float g, float u) {
  // Same expression as ATen's CUDA silu (x / (1 + exp(-x))) with full-precision expf; the
  // product is a single FP32 multiply, rounded once to BF16 by the caller.
  return (g / (1.0f + expf(-g))) * u;
}

__device__ __forceinline__ float group_scale(float amax) {
  return fmaxf(amax, MOE_AMAX_EPS) / MOE_FP8_MAX;
}

// Four floats -> four e4m3 bytes (lowest k in the lowest byte), saturating, RNE.
__device__ __forceinline__ uint32_t quant4(float a, float b, float c, float d, float scale) {
  float2 lo = make_float2(fminf(fmaxf(a / scale, -MOE_FP8_MAX), MOE_FP8_MAX),
                          fminf(fmaxf(b / scale, -MOE_FP8_MAX), MOE_FP8_MAX));
  float2 hi = make_float2(fminf(fmaxf(c / scale, -MOE_FP8_MAX), MOE_FP8_MAX),
                          fminf(fmaxf(d / scale, -MOE_FP8_MAX), MOE_FP8_MAX));
  uint32_t l = __nv_cvt_float2_to_fp8x2(lo, __NV_SATFINITE, __NV_E4M3);
  uint32_t h = __nv_cvt_float2_to_fp8x2(hi, __NV_SATFINITE, __NV_E4M3);
  return (l & 0xffffu) | (h << 16);
}

// x / scale from the group's reciprocal r = 1 / scale (IEEE): q0 = RN(x r), then one FMA correction
// RN(q0 + RN(x - q0 scale) r) (Markstein), the quotient that div.rn's own fast path forms. quant4_rcp is quant4 with it, for
// finite scales; scripts/gpu/quant_exact.cu compares it byte for byte with quant4 over every BF16 value x and every finite
// BF16 amax >= |x| (the whole domain of a group quantization of BF16 values).
__device__ __forceinline__ float div_rcp(float x, float scale, float r) {
  const float q0 = __fmul_rn(x, r);
  return copysignf(__fmaf_rn(__fmaf_rn(-q0, scale, x), r, q0), x);  // the sign of a zero quotient (run19 c: -0 / s)
}
__device__ __forceinline__ uint32_t quant4_rcp(float a, float b, float c, float d, float scale, float r) {
  float2 lo = make_float2(fminf(fmaxf(div_rcp(a, scale, r), -MOE_FP8_MAX), MOE_FP8_MAX),
                          fminf(fmaxf(div_rcp(b, scale, r), -MOE_FP8_MAX), MOE_FP8_MAX));
  float2 hi = make_float2(fminf(fmaxf(div_rcp(c, scale, r), -MOE_FP8_MAX), MOE_FP8_MAX),
                          fminf(fmaxf(div_rcp(d, scale, r), -MOE_FP8_MAX), MOE_FP8_MAX));
  uint32_t l = __nv_cvt_float2_to_fp8x2(lo, __NV_SATFINITE, __NV_E4M3);
  uint32_t h = __nv_cvt_float2_to_fp8x2(hi, __NV_SATFINITE, __NV_E4M3);
  return (l & 0xffffu) | (h << 16);
}

// One group of 128 BF16 values held 4 per lane across a warp: the group's scale (warp-wide amax) and this
// lane's 4 e4m3 bytes (moe_align's x quantization, also in the one-kernel layers).
__device__ __forceinline__ uint32_t quant_group_warp(const uint2 raw, float& scale) {
  const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
  const float2 a = __bfloat1622float2(h2[0]), b = __bfloat1622float2(h2[1]);
  float amax = fmaxf(fmaxf(fabsf(a.x), fabsf(a.y)), fmaxf(fabsf(b.x), fabsf(b.y)));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  scale = group_scale(amax);
  return quant4(a.x, a.y, b.x, b.y, scale);
}

// The act+quant step of every layer in this family, written once: one 128-group of h values (BF16-valued floats) held
// 8 per lane across a half-warp -> the group's scale (half-warp amax, group_scale) and this lane's 8 e4m3 bytes.
// The xor shuffles stay inside each half-warp, so the two halves of a warp quantize two groups at once.
__device__ __forceinline__ uint2 quant8_halfwarp(const float (&h)[8], float& scale) {
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(h[i]));
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  scale = group_scale(amax);
  uint2 q;
  q.x = quant4(h[0], h[1], h[2], h[3], scale);
  q.y = quant4(h[4], h[5], h[6], h[7], scale);
  return q;
}

__device__ __forceinline__ void bf16x8_to_float(const uint4 v, float (&f)[8]) {
  const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 t = __bfloat1622float2(p[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

// ---- the FP8 MMA core shared by the v1 (expert_gemm.cu), v3 (expert_stream.cu) and one-token (moe_m1.cu)
// GEMMs: mma.sync m16n8k32 e4m3 with swapped operands (16 weight rows x 8 tokens) and the per-128-K-block
// permutation (each lane reads 32 contiguous bytes of its weight row and of its token).
__device__ __forceinline__ void mma_e4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// This lane's 32 bytes of a quantized token row for one K block (two 16-byte loads); padding
// columns give zeros.
__device__ __forceinline__ void load_b(const uint8_t* src, bool valid, uint32_t (&b)[8]) {
  uint4 v0 = make_uint4(0u, 0u, 0u, 0u), v1 = v0;
  if (valid) {
    v0 = *reinterpret_cast<const uint4*>(src);
    v1 = *reinterpret_cast<const uint4*>(src + 16);
  }
  b[0] = v0.x; b[1] = v0.y; b[2] = v0.z; b[3] = v0.w;
  b[4] = v1.x; b[5] = v1.y; b[6] = v1.z; b[7] = v1.w;
}

// A-fragment rows g and g + 8 (32 bytes each) of a 16-row weight tile (global or shared memory).
template <typename Stride>
__device__ __forceinline__ void load_a(uint4 (&a)[4], const uint8_t* row_g, Stride row_stride) {
  a[0] = *reinterpret_cast<const uint4*>(row_g);
  a[1] = *reinterpret_cast<const uint4*>(row_g + 16);
  a[2] = *reinterpret_cast<const uint4*>(row_g + 8 * row_stride);
  a[3] = *reinterpret_cast<const uint4*>(row_g + 8 * row_stride + 16);
}

// One K block's 4 MMA steps into a fresh fragment d (no scaling): the expensive half of kblock_mma2, which
// moe_ml.cu runs in a second warp ahead of the scaled accumulation chain.
__device__ __forceinline__ void kblock_d(float (&d)[4], const uint4 (&a)[4], const uint32_t (&b)[8]) {
  const uint32_t* lo = reinterpret_cast<const uint32_t*>(&a[0]);
  const uint32_t* hi = reinterpret_cast<const uint32_t*>(&a[2]);
  d[0] = d[1] = d[2] = d[3] = 0.f;
#pragma unroll
  for (int s = 0; s < 4; ++s) mma_e4m3(d, lo[2 * s], hi[2 * s], lo[2 * s + 1], hi[2 * s + 1], b[2 * s], b[2 * s + 1]);
}

// acc += d * weight scale (rows g: ws_lo, rows g + 8: ws_hi) * token scale (columns 2t, 2t + 1).
__device__ __forceinline__ void kblock_acc2(float (&acc)[4], const float (&d)[4], float ws_lo, float ws_hi, float s_tok,
                                            int t) {
  const float s0 = __shfl_sync(0xffffffffu, s_tok, (2 * t) * 4);
  const float s1 = __shfl_sync(0xffffffffu, s_tok, (2 * t + 1) * 4);
  acc[0] = fmaf(d[0], ws_lo * s0, acc[0]);
  acc[1] = fmaf(d[1], ws_lo * s1, acc[1]);
  acc[2] = fmaf(d[2], ws_hi * s0, acc[2]);
  acc[3] = fmaf(d[3], ws_hi * s1, acc[3]);
}

// kblock_mma for a tile whose rows g (0-7) and g + 8 (8-15) come from different 128-row scale blocks
// (moe_ms.cu: rows 0-7 gate, rows 8-15 up of the same 8 columns): the same arithmetic per element.
__device__ __forceinline__ void kblock_mma2(float (&acc)[4], const uint4 (&a)[4], const uint32_t (&b)[8], float ws_lo,
                                            float ws_hi, float s_tok, int t) {
  float d[4];
  kblock_d(d, a, b);
  kblock_acc2(acc, d, ws_lo, ws_hi, s_tok, t);
}

// One K block for one 16-row weight tile and one 8-token tile: 4 MMA steps into a fresh
// fragment, then acc += frag * wscale * token scale (columns 2t and 2t+1 of the fragment).
__device__ __forceinline__ void kblock_mma(float (&acc)[4], const uint4 (&a)[4], const uint32_t (&b)[8], float ws,
                                           float s_tok, int t) {
  kblock_mma2(acc, a, b, ws, ws, s_tok, t);
}

}  // namespace moe
