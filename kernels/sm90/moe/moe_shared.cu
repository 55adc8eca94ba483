// MoE shared expert + combine for 1..128 tokens, run on the SMs the routed layer leaves free.
//
// Qwen3.6's MoE block is out = routed(x) + sigmoid(x . w_gate) * shared_mlp(x), the shared MLP an FP8 block-scaled
// expert of width 512 (3 MB of weights). The routed layer (moe_layer_t1 / moe_layer_stream) is a cooperative grid of
// 128 CTAs, one per SM, launched with programmatic dependent launch; it triggers its dependents at entry. This kernel
// is that dependent: a grid of 4 CTAs (the H200 has 132 SMs) scheduled while the routed layer still runs, which
// computes the whole shared expert beside it and only then waits (griddepcontrol.wait) for the routed sum to add
// its own share. The shared expert thus costs the weight stream of 4 SMs that would otherwise idle, and the combine
// costs one read-add-write of the output after the routed layer ends (no separate kernel, no second stream).
//
// Split: CTA c owns h columns [128 c, 128 c + 128) (its gate rows 128 c.. and up rows 512 + 128 c.. of w13: one 128-group
// of h, so h's quantization is CTA-local) and output rows [512 c, 512 c + 512) of w2 (all of K = 512: the down GEMM
// needs every CTA's h, exchanged through global memory behind one 4-CTA barrier). Weights are read in a packed copy made
// once at load (netra/ops/moe.py pack_shared_expert): w13p [4 CTAs][16 K blocks][256 rows][128 B] (rows: CTA c's 128 gate
// rows, then its 128 up rows) and w2p [4][4 K blocks][512 rows][128 B], so every ring stage is one contiguous 32 KB bulk
// copy. Tokens are processed in passes of 32 (x_q of a pass is 64 KB of shared memory); a pass after the first re-reads
// the CTA's weights from L2.
//
// Launched with programmatic dependent launch and NOT as a cooperative grid: a cooperative launch waits for the GPU
// to drain (measured: no overlap at all), while the 4-CTA barrier below needs no guarantee: a CTA that cannot be
// resident yet runs once the routed layer (which never waits on this kernel) leaves its SM.
// Warps 0..15 compute (warp w: row tile w of a 256-row stage, every 8-token tile of the pass, MMA core and K order of
// moe_common.cuh, the FP32 chain over K blocks in order per element); warp 16 lane 0 is the bulk-copy producer.
// Numerics follow the shared route of netra/ops/moe.py moe_ref: x quantized per token in groups of 128 (as the routed
// layer), gate/up accumulated in FP32 per 128-K block and rounded to BF16, h = bf16(SiLU(gate) * up) quantized per
// 128, down accumulated likewise, y = bf16(acc * sigmoid(bf16(x . w_gate))); the combine out = bf16(routed + y) rounds
// twice where the oracle sums all nine routes in FP32 and rounds once (the contract's tolerance covers it).
//
// Workspace (zeroed once): word 0 the 4-CTA barrier's count (only grows, 4 per launch); bytes [256, 256 + 64 KB) h_q
// [128, 512] E4M3, then h_s [128, 4] FP32. One stream at a time per device.
#include "moe_common.cuh"
#include "moe_sync.cuh"
#include <stddef.h>

#define HID 2048
#define INTER 512
#define SH_CTAS 4
#define SH_WARPS 16                    // compute warps
#define SH_THREADS (32 * (SH_WARPS + 1))  // + the producer warp
#define PASS 32                        // tokens per pass
#define MAXM 128
#define NST 4                          // ring stages
#define STAGE_BYTES 32768              // 256 rows x 128 B
#define GU_STAGES 16                   // per pass: K blocks of w13
#define DN_STAGES 8                    // per pass: 4 K blocks x 2 halves of the CTA's 512 w2 rows
#define HQ_OFF 256                     // workspace byte offsets
#define HS_OFF (HQ_OFF + MAXM * INTER)

#define OFF_RING 0
#define OFF_XQ (OFF_RING + NST * STAGE_BYTES)   // 131072: x_q [32][2048] E4M3 (a pass's tokens); down: h_q [32][512]
#define OFF_XS (OFF_XQ + PASS * HID)            // 196608: x_s [32][16] FP32; down: h_s [32][4]
#define OFF_GU (OFF_XS + PASS * 16 * 4)         // 198656: gate|up [32][256] BF16 of the pass
#define OFF_SW (OFF_GU + PASS * 256 * 2)        // 215040: sigmoid gate [128] FP32
#define OFF_BAR (OFF_SW + MAXM * 4)             // 215552: 2 x NST mbarriers
#define SH_SMEM (OFF_BAR + 2 * NST * 8)         // 215616

struct SharedParams {
  const __nv_bfloat16* x;       // [M, 2048]
  const __nv_bfloat16* w_gate;  // [2048] the shared-expert gate row
  const uint8_t* w13p;          // packed (see above)
  const float* w13_scale;       // [8, 16] the shared expert's w13 block scales
  const uint8_t* w2p;           // packed (see above)
  const float* w2_scale;        // [16, 4]
  __nv_bfloat16* out;           // [M, 2048]: the routed sum in (read after griddepcontrol.wait), routed + shared out
  unsigned char* ws;            // workspace
  int M;
  int _pad;
};

extern "C" __device__ unsigned int netra_params_layout[] = {
    sizeof(SharedParams), offsetof(SharedParams, x), offsetof(SharedParams, w_gate), offsetof(SharedParams, w13p),
    offsetof(SharedParams, w13_scale), offsetof(SharedParams, w2p), offsetof(SharedParams, w2_scale),
    offsetof(SharedParams, out), offsetof(SharedParams, ws), offsetof(SharedParams, M)};

namespace {

__device__ __forceinline__ void compute_sync() {
  asm volatile("bar.sync 1, %0;\n" ::"n"(SH_WARPS * 32) : "memory");
}

}  // namespace

extern "C" __global__ void __launch_bounds__(SH_THREADS, 1) moe_shared(const __grid_constant__ SharedParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* ring = smem + OFF_RING;
  uint8_t* s_xq = smem + OFF_XQ;
  float* s_xs = reinterpret_cast<float*>(smem + OFF_XS);
  __nv_bfloat16* s_gu = reinterpret_cast<__nv_bfloat16*>(smem + OFF_GU);
  float* s_sw = reinterpret_cast<float*>(smem + OFF_SW);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + OFF_BAR);
  uint64_t* empty = full + NST;
  __shared__ float s_ws13[2][16];  // w13 scales: gate row block c, up row block 4 + c
  __shared__ float s_ws2[4][4];    // w2 scales of row blocks 4c..4c+3
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const int c = blockIdx.x;
  const int M = p.M;
  const int npass = (M + PASS - 1) / PASS;
  uint8_t* g_hq = p.ws + HQ_OFF;
  float* g_hs = reinterpret_cast<float*>(p.ws + HS_OFF);

  if (tid == 0) {
    if (gridDim.x != SH_CTAS || blockDim.x != SH_THREADS || M < 1 || M > MAXM) __trap();
    for (int s = 0; s < NST; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], SH_WARPS);
    }
    mbar_fence_init();
  }
  if (tid < 32) s_ws13[tid >> 4][tid & 15] = __ldg(p.w13_scale + ((tid >> 4) * 4 + c) * 16 + (tid & 15));
  if (tid >= 32 && tid < 48) s_ws2[(tid - 32) >> 2][tid & 3] = __ldg(p.w2_scale + (4 * c + ((tid - 32) >> 2)) * 4 + (tid & 3));
  __syncthreads();

  if (wid == SH_WARPS) {  // producer: the stages in consumption order, through the ring
    if (lane == 0) {
      const uint64_t pol = l2_evict_last();  // re-read by later passes (and the next decode step's weights are others)
      int j = 0;
      for (int ps = 0; ps < npass; ++ps)
        for (int kb = 0; kb < GU_STAGES; ++kb, ++j) {
          const int s = j % NST;
          if (j >= NST) mbar_wait(&empty[s], ((j / NST) - 1) & 1);
          mbar_expect_tx(&full[s], STAGE_BYTES);
          bulk_g2s_hint(ring + s * STAGE_BYTES, p.w13p + ((size_t)c * GU_STAGES + kb) * STAGE_BYTES, STAGE_BYTES,
                        &full[s], pol);
        }
      for (int ps = 0; ps < npass; ++ps)
        for (int st = 0; st < DN_STAGES; ++st, ++j) {
          const int s = j % NST;
          if (j >= NST) mbar_wait(&empty[s], ((j / NST) - 1) & 1);
          mbar_expect_tx(&full[s], STAGE_BYTES);
          bulk_g2s_hint(ring + s * STAGE_BYTES, p.w2p + ((size_t)c * DN_STAGES + st) * STAGE_BYTES, STAGE_BYTES,
                        &full[s], pol);
        }
    }
    return;
  }

  // ---- compute warps
  const int g = lane >> 2, t4 = lane & 3;
  // sigmoid gate of every token: warp per token, lane 64 values (FP32 dot, rounded to BF16, sigmoid in FP32)
  for (int t = wid; t < M; t += SH_WARPS) {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float xf[8], wf[8];
      moe::bf16x8_to_float(__ldcg(reinterpret_cast<const uint4*>(p.x + (size_t)t * HID + j * 256 + lane * 8)), xf);
      moe::bf16x8_to_float(__ldg(reinterpret_cast<const uint4*>(p.w_gate + j * 256 + lane * 8)), wf);
#pragma unroll
      for (int q = 0; q < 8; ++q) acc = fmaf(xf[q], wf[q], acc);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) s_sw[t] = 1.0f / (1.0f + expf(-__bfloat162float(__float2bfloat16_rn(acc))));
  }

  int j = 0;  // ring item
  // gate_up: warp w = row tile w of the stage (w < 8: gate rows 16 w.., else up rows 16 (w - 8)..)
  const float* ws13 = s_ws13[wid >> 3];
  for (int ps = 0; ps < npass; ++ps) {
    const int t0 = ps * PASS, nt = min(PASS, M - t0), ntt = (nt + 7) / 8;
    // x of the pass quantized per group of 128 (moe_align's arithmetic): warp task (token, group)
    for (int u = wid; u < nt * 16; u += SH_WARPS) {
      const int r = u >> 4, grp = u & 15;
      const uint2 raw = __ldcg(reinterpret_cast<const uint2*>(p.x + (size_t)(t0 + r) * HID + grp * 128) + lane);
      float sc;
      *reinterpret_cast<uint32_t*>(s_xq + r * HID + grp * 128 + lane * 4) = moe::quant_group_warp(raw, sc);
      if (lane == 0) s_xs[r * 16 + grp] = sc;
    }
    compute_sync();
    float acc[4][4];
#pragma unroll
    for (int tt = 0; tt < 4; ++tt) acc[tt][0] = acc[tt][1] = acc[tt][2] = acc[tt][3] = 0.0f;
#pragma unroll 1
    for (int kb = 0; kb < GU_STAGES; ++kb, ++j) {
      const int s = j % NST;
      mbar_wait(&full[s], (j / NST) & 1);
      uint4 a[4];
      moe::load_a(a, ring + s * STAGE_BYTES + (16 * wid + g) * 128 + t4 * 32, 128);
      const float ws = ws13[kb];
#pragma unroll
      for (int tt = 0; tt < 4; ++tt) {
        if (tt < ntt) {
          const int r = 8 * tt + g;
          uint32_t b[8];
          moe::load_b(s_xq + r * HID + kb * 128 + t4 * 32, r < nt, b);
          moe::kblock_mma(acc[tt], a, b, ws, r < nt ? s_xs[r * 16 + kb] : 0.0f, t4);
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);
    }
    // gate|up of the pass, rounded to BF16: [token][row of 256]
#pragma unroll
    for (int tt = 0; tt < 4; ++tt) {
      if (tt < ntt) {
        const int r0 = 8 * tt + 2 * t4, row = 16 * wid + g;
        s_gu[r0 * 256 + row] = __float2bfloat16_rn(acc[tt][0]);
        s_gu[(r0 + 1) * 256 + row] = __float2bfloat16_rn(acc[tt][1]);
        s_gu[r0 * 256 + row + 8] = __float2bfloat16_rn(acc[tt][2]);
        s_gu[(r0 + 1) * 256 + row + 8] = __float2bfloat16_rn(acc[tt][3]);
      }
    }
    compute_sync();
    // h = bf16(SiLU(gate) * up) of the CTA's 128 columns, quantized per token (one 128-group): half-warp per token
    // (the whole warp runs the shuffles of quant8_halfwarp, a half-warp past the pass's tokens on s_gu rows the
    // pass wrote anyway, and only valid rows are stored: a shuffle with a full mask needs every lane)
    if (2 * wid < nt) {
      const int hw = lane >> 4, sub = lane & 15;
      const int r = 2 * wid + hw;
      float h[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float gt = __bfloat162float(s_gu[r * 256 + sub * 8 + i]);
        const float up = __bfloat162float(s_gu[r * 256 + 128 + sub * 8 + i]);
        h[i] = __bfloat162float(__float2bfloat16_rn(moe::silu_mul(gt, up)));
      }
      float sc;
      const uint2 q = moe::quant8_halfwarp(h, sc);
      if (r < nt) {
        *reinterpret_cast<uint2*>(g_hq + (size_t)(t0 + r) * INTER + 128 * c + sub * 8) = q;
        if (sub == 0) g_hs[(t0 + r) * 4 + c] = sc;
      }
    }
    compute_sync();  // s_xq / s_gu reused by the next pass
  }

  // every CTA's h is in global memory: the 4-CTA barrier (a count that only grows), named barrier for the 16 warps
  compute_sync();
  if (tid == 0) grid_arrive_wait_mono(reinterpret_cast<unsigned*>(p.ws), SH_CTAS);
  compute_sync();

  // down: stage (kb, half) = rows [512 c + 256 half, +256) x K block kb; warp w: row tile w of the half, both halves
  bool waited = false;
  for (int ps = 0; ps < npass; ++ps) {
    const int t0 = ps * PASS, nt = min(PASS, M - t0), ntt = (nt + 7) / 8;
    uint8_t* s_hq = s_xq;    // [32][512]
    float* s_hs = s_xs;      // [32][4]
    for (int i = tid; i < nt * INTER / 16; i += SH_WARPS * 32)
      reinterpret_cast<uint4*>(s_hq)[i] = __ldcg(reinterpret_cast<const uint4*>(g_hq + (size_t)t0 * INTER) + i);
    for (int i = tid; i < nt * 4; i += SH_WARPS * 32) s_hs[i] = __ldcg(g_hs + t0 * 4 + i);
    compute_sync();
    float acc[2][4][4];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
#pragma unroll
      for (int tt = 0; tt < 4; ++tt) acc[hf][tt][0] = acc[hf][tt][1] = acc[hf][tt][2] = acc[hf][tt][3] = 0.0f;
#pragma unroll 1
    for (int kb = 0; kb < 4; ++kb) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf, ++j) {
        const int s = j % NST;
        mbar_wait(&full[s], (j / NST) & 1);
        uint4 a[4];
        moe::load_a(a, ring + s * STAGE_BYTES + (16 * wid + g) * 128 + t4 * 32, 128);
        const float ws = s_ws2[2 * hf + (wid >> 3)][kb];
#pragma unroll
        for (int tt = 0; tt < 4; ++tt) {
          if (tt < ntt) {
            const int r = 8 * tt + g;
            uint32_t b[8];
            moe::load_b(s_hq + r * INTER + kb * 128 + t4 * 32, r < nt, b);
            moe::kblock_mma(acc[hf][tt], a, b, ws, r < nt ? s_hs[r * 4 + kb] : 0.0f, t4);
          }
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[s]);
      }
    }
    if (!waited) {
      pdl_wait();  // the routed layer has completed and its output is visible
      waited = true;
    }
    // y = bf16(acc * sigmoid gate); out = bf16(routed + y)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
#pragma unroll
      for (int tt = 0; tt < 4; ++tt) {
        if (tt < ntt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = 8 * tt + 2 * t4 + (e & 1);
            const int row = 512 * c + 256 * hf + 16 * wid + g + (e >> 1) * 8;
            if (r < nt) {
              const float y = __bfloat162float(__float2bfloat16_rn(acc[hf][tt][e] * s_sw[t0 + r]));
              __nv_bfloat16* o = p.out + (size_t)(t0 + r) * HID + row;
              *o = __float2bfloat16_rn(__bfloat162float(__ldcg(o)) + y);
            }
          }
        }
      }
    }
    compute_sync();  // s_hq reused by the next pass
  }
}
