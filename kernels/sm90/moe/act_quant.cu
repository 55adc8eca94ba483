// Fused SiLU(gate)*up + FP8 E4M3 group quantization (deliverable 1 of issue 7).
//
// In:  gu  [rows, 2*512] BF16, gate in columns [0, 512), up in [512, 1024) (SGLang's w13 order).
// Out: q   [rows, 512] e4m3, scale [rows, 4] FP32 (one per group of 128).
// One half-warp owns one group of 128 outputs: each lane loads 8 gate + 8 up values with two
// 16-byte loads, so a row is 4 half-warps and a 128-thread block covers 2 rows. The amax is a
// 4-step shuffle inside the half-warp; nothing goes through shared memory.
#include "moe_common.cuh"
#include <stddef.h>

struct ActQuantParams {
  const __nv_bfloat16* gu;
  uint8_t* q;
  float* scale;
  int rows;
  int width;  // must be 512 (checked on the host and here)
};

// sizeof, then each field's offsetof: the runtime checks it against the contract's params_layout.
extern "C" __device__ unsigned int netra_params_layout[] = {
    sizeof(ActQuantParams), offsetof(ActQuantParams, gu), offsetof(ActQuantParams, q),
    offsetof(ActQuantParams, scale), offsetof(ActQuantParams, rows), offsetof(ActQuantParams, width)};

extern "C" __global__ void __launch_bounds__(128) moe_act_quant(const ActQuantParams p) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;                // 0..3
  const int row = blockIdx.x * 2 + (warp >> 1);     // two warps per row
  const int group = (warp & 1) * 2 + (lane >> 4);   // 0..3
  const int sub = lane & 15;                        // 8 outputs each
  if (row >= p.rows || p.width != 512) return;
  const int col = group * 128 + sub * 8;
  const __nv_bfloat16* src = p.gu + (size_t)row * 1024;
  const uint4 gv = *reinterpret_cast<const uint4*>(src + col);
  const uint4 uv = *reinterpret_cast<const uint4*>(src + 512 + col);
  float g[8], u[8], h[8];
  moe::bf16x8_to_float(gv, g);
  moe::bf16x8_to_float(uv, u);
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    h[i] = __bfloat162float(__float2bfloat16_rn(moe::silu_mul(g[i], u[i])));
    amax = fmaxf(amax, fabsf(h[i]));
  }
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float s = moe::group_scale(amax);
  uint2 out;
  out.x = moe::quant4(h[0], h[1], h[2], h[3], s);
  out.y = moe::quant4(h[4], h[5], h[6], h[7], s);
  *reinterpret_cast<uint2*>(p.q + (size_t)row * 512 + col) = out;
  if (sub == 0) p.scale[row * 4 + group] = s;
}
