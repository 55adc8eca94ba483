// Launch parameters of the one-token MoE layers moe_m1 (moe_m1.cu) and moe_m1f (moe_m1f.cu): the host fills both the same
// way (netra/ops/moe_fp8.py _M1Params, 96 bytes), and netra_params_layout lets the runtime check the layout.
#pragma once
#include <cuda_bf16.h>
#include <stddef.h>
#include <stdint.h>

struct M1Params {
  const __nv_bfloat16* x;    // [1, 2048]
  const int* topk_ids;       // [1, 8] int32, rank order, distinct
  const float* topk_w;       // [1, 8] fp32
  const uint8_t* w13;        // [E(+1), 1024, 2048] e4m3
  const float* w13_scale;    // [E(+1), 8, 16]
  const uint8_t* w2;         // [E(+1), 2048, 512] e4m3
  const float* w2_scale;     // [E(+1), 16, 4]
  __nv_bfloat16* gu;         // m1: [>= 8, 1024] BF16 gate | up cache; m1f: h [8, 512] BF16 (route order, scratch)
  __nv_bfloat16* out;        // [1, 2048]
  unsigned* bar;             // workspace (zeroed once): see each kernel's header
  uint8_t* dbg_hq;           // [>= 8, 512] copy of h_q (route order) when non-null (tests; CTA 0 writes)
  float* dbg_hs;             // [>= 8, 4]
};

extern "C" __device__ unsigned int netra_params_layout[] = {
    sizeof(M1Params), offsetof(M1Params, x), offsetof(M1Params, topk_ids), offsetof(M1Params, topk_w),
    offsetof(M1Params, w13), offsetof(M1Params, w13_scale), offsetof(M1Params, w2), offsetof(M1Params, w2_scale),
    offsetof(M1Params, gu), offsetof(M1Params, out), offsetof(M1Params, bar), offsetof(M1Params, dbg_hq),
    offsetof(M1Params, dbg_hs)};
