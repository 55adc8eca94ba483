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

__device__ __forceinline__ void bf16x8_to_float(const uint4 v, float (&f)[8]) {
  const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 t = __bfloat1622float2(p[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

}  // namespace moe
