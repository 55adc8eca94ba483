// Exhaustive check of moe::quant4_rcp against moe::quant4 (issue 7 round 10, ML_QRCP): thread a takes the BF16 amax with
// bits a (every finite value >= 0) and every BF16 x with |x| <= amax or x NaN (a group's amax bounds its values; fmaxf drops
// NaNs). Counted: e4m3 bytes that differ, and FP32 quotients that differ from IEEE x / scale. Built here
// (scripts/gpu/stream_probe.py --build), run on the device (--quant-exact).
#include "moe_common.cuh"

extern "C" __global__ void quant_exact(unsigned long long* counts, unsigned* first) {
  const unsigned a = blockIdx.x * blockDim.x + threadIdx.x;
  if (a > 0x7f7fu) return;  // 0x7f80: +inf
  const float amax = __uint_as_float(a << 16);
  const float scale = moe::group_scale(amax), r = 1.0f / scale;
  unsigned long long nbyte = 0, nquot = 0, n = 0;
  for (unsigned xb = 0; xb < 65536u; ++xb) {
    const float x = __uint_as_float(xb << 16);
    if (!(fabsf(x) <= amax) && !isnan(x)) continue;
    ++n;
    const uint32_t ref = moe::quant4(x, -x, x, x, scale), got = moe::quant4_rcp(x, -x, x, x, scale, r);
    if (ref != got) {
      ++nbyte;
      if (atomicCAS(first, 0u, 1u) == 0u) {
        first[1] = a;
        first[2] = xb;
      }
    }
    if (!isnan(x) && __float_as_uint(x / scale) != __float_as_uint(moe::div_rcp(x, scale, r))) ++nquot;
  }
  atomicAdd(counts, nbyte);
  atomicAdd(counts + 1, nquot);
  atomicAdd(counts + 2, n);
}
