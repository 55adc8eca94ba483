// MoE v3: weight-streaming FP8 block-scaled grouped expert GEMMs for decode (issue 7, deliverable 3).
//
// Same math, metadata and numerics as v1 (expert_gemm.cu: swapped-operand mma.sync m16n8k32 e4m3,
// K permuted inside each 128-wide block so that a lane reads 32 contiguous bytes of its weight row
// and of its token; FP32 fragment per K block scaled by weight-block x token-group scale). What
// changes is how the weights move:
//
// * Persistent grid (one CTA per SM, grid = SM count queried at bind time). The work is a list of
//   32 KB weight items computed on the device from num_slots: gate_up item = (slot, 16 rows of the
//   1024 gate|up rows) x full K (16 rows x 2048 B, contiguous); down item = (slot, 64 rows of the
//   2048 output rows) x full K (64 x 512 B, contiguous). CTA b owns the contiguous item range
//   [b*N/G, (b+1)*N/G) (consecutive items share an expert, so the fused prologue below is reused).
// * One producer thread (warp 4, lane 0) copies items with TMA 1D bulk copies
//   (cp.async.bulk ... mbarrier::complete_tx::bytes) into a ring of STAGES x 32 KB of shared memory
//   (full/empty mbarriers per stage); item j of the CTA goes to stage j % STAGES and to consumer
//   warp j % NCW (6 for gate_up, 4 for down). Consumer warps run the MMAs from shared memory and release the stage; no
//   CTA-wide barrier after setup; a warp releases its stage as soon as its last MMA has read it
//   (before its epilogue stores), so the copy engine refills it while the warp writes.
//   Shared-memory reads of a quarter-warp touch 2 rows at the same offset: a 2-way bank conflict
//   (rows are 2048 / 512 B apart; a bulk copy cannot swizzle), far below the ~18 B/clk/SM needed.
// * PDL: barrier init before griddepcontrol.wait; launch_dependents right after the wait (so a
//   dependent kernel that starts early knows this kernel's own predecessor has completed).
//   moe_down's producer streams w2 BEFORE its griddepcontrol.wait, reading only the slot metadata
//   (num_slots, slot_expert) written by moe_align two kernels back. Argument: moe_down is launched
//   (PDL) only once every moe_gate_up CTA executed griddepcontrol.launch_dependents or exited, and
//   moe_gate_up executes it only after its own griddepcontrol.wait returned, i.e. after moe_align
//   completed and its writes were made visible. The weights themselves are never written. In the
//   unfused build the predecessor moe_act_quant is not a PDL kernel, so moe_down starts only once
//   it completed (and moe_act_quant started only once moe_gate_up completed). Everything moe_down
//   reads from moe_gate_up / moe_act_quant (gu, hq, hs) is read only after griddepcontrol.wait.
// * Reads before griddepcontrol.wait, per kernel of the v3 sequence (everything else follows the wait;
//   every launch_dependents follows its kernel's wait):
//     moe_align_v3 / moe_route_v3 (route.cu, MOE_PDL=1): none (wait at entry).
//     moe_gate_up_v3*: none (mbarrier init in shared memory only).
//     moe_down_v3* producer: num_slots, slot_expert (ld.global.cg), and w2 (never written);
//       TSPLIT builds: every thread also reads slot_start (ld.global.cg) to build the item map.
//       All from moe_align/moe_route, two kernels back: safe by the argument above.
//     moe_act_quant (unfused A/B only): not launched with PDL.
//   (Round 1's "PDL race" in the H200 check was a host bug: the route/align params buffer is shared
//   per contract between MoeSm90 instances and was filled once at construction; see moe_fp8.py.)
// * moe_down with MOE_FUSE_ACT=1 (default) computes h = bf16(SiLU(gate)*up) and its E4M3 group
//   quantization for the item's tokens into shared memory (the same moe_common.cuh helpers and
//   lane mapping as moe_act_quant, IEEE divisions: bitwise equal), once per (warp, slot, 16-token
//   chunk); dbg_hq/dbg_hs (null in production) receive a copy for the bitwise test. MOE_FUSE_ACT=0
//   reads moe_act_quant's output instead (the A/B build).
// * Top-k sum: each (64-column tile, token) has a counter (workspace, zeroed once); the warp that
//   writes a route's 64 columns of y adds 1; the arrival that makes it routes_per_token sums that
//   token's routes for the 64 columns in rank order (FP32, shared expert last, as v1) into out and
//   resets the counter (self-resetting, no memset, graph-safe; one stream at a time per device).
#include "moe_common.cuh"
#include "moe_sync.cuh"
#include <stddef.h>

#ifndef MOE_FUSE_ACT
#define MOE_FUSE_ACT 1
#endif
#ifndef GU_PIPE
#define GU_PIPE 0                  // 1: pipelined gate_up consumer (metadata one item ahead, B double-buffered)
#endif
#ifndef DN_PIPE
#define DN_PIPE 0                  // 1: down loads all 4 K blocks' B before its MMAs; top-k sum loads unrolled
#endif
#ifndef DN_BATCH
#define DN_BATCH 0                 // 1: a down warp's top-k arrivals of two consecutive chunks share one fence
#endif
#if DN_BATCH && !DN_PIPE
#error "DN_BATCH needs DN_PIPE"
#endif
#ifndef DN_WSG
#define DN_WSG 0                   // 1 (DN_STREAM): the expert's 64 w2 scales once per group (2 per lane,
#endif                             //    shuffled per item) instead of one global load per item; the last
                                   //    arrival ticket sums the largest top-k share (it never polls)
#ifndef TSPLIT
#define TSPLIT 0                   // 1: an item is (slot, row tile, token chunk): a slot with many tokens (the
#endif                             //    shared expert, skewed loads) spreads over many CTAs (needs GU_PIPE)
#if TSPLIT && !GU_PIPE
#error "TSPLIT is implemented in the pipelined gate_up consumer only (every build compiles both kernels: add -DGU_PIPE=1)"
#endif
#define MAX_SLOTS 257

#define HID 2048
#define INTER 512
#define ROUTE_STRIDE 9
#define MAX_TOKENS 128
#define ITEM_BYTES 32768
// Ring depth and consumer warps per kernel. STAGES % NCW == 0 so that a stage is always consumed by
// the same warp (item j and item j - STAGES share a warp): a warp then never waits on a full barrier
// whose previous phase is still pending (parity waits cannot tell phase q from phase q - 2, and
// bulk copies may complete out of order).
#ifndef GU_NCW
#define GU_NCW 6                   // gate_up: 6 consumer warps, one stage each
#endif
#ifndef GU_STAGES
#define GU_STAGES 6                // 192 KB of weights in flight per SM (round 4 small-M pair: 3, so that a
#endif                             // down CTA of the same geometry fits on the SM beside it: see moe_fp8.py)
#ifndef DN_NCW
#define DN_NCW 4                   // down: 4 consumer warps (+ their fused-h buffers)
#endif
#ifndef DN_STAGES
#define DN_STAGES 4                // 128 KB
#endif
#define GU_THREADS (32 * (GU_NCW + 1))   // + one producer warp
#define DN_THREADS (32 * (DN_NCW + 1))
static_assert(GU_STAGES % GU_NCW == 0 && DN_STAGES % DN_NCW == 0, "a stage must map to one consumer warp");
#define GU_ITEMS_PER_SLOT 64       // 1024 rows / 16
#define DN_ITEMS_PER_SLOT 32       // 2048 rows / 64
#ifndef HCHUNK
#define HCHUNK 16                  // tokens per fused-h chunk (8 or 16: one or two 8-token MMA tiles)
#endif
#define HTILES (HCHUNK / 8)
static_assert(HCHUNK == 8 || HCHUNK == 16, "HCHUNK is one or two MMA token tiles");
#define HROW 528                   // h row stride in shared memory (512 + 16: no bank conflicts)
#define HBUF_BYTES (HCHUNK * HROW + HCHUNK * 4 * 4)

struct GemmParamsV3 {
  const uint8_t* w13;        // [E+1, 1024, 2048]
  const float* w13_scale;    // [E+1, 8, 16]
  const uint8_t* w2;         // [E+1, 2048, 512]
  const float* w2_scale;     // [E+1, 16, 4]
  const uint8_t* xq;         // [M, 2048] e4m3
  const float* xs;           // [M, 16]
  __nv_bfloat16* gu;         // [M*9, 1024] BF16 gate | up (route order)
  const uint8_t* hq;         // [M*9, 512] (unfused build: moe_act_quant out)
  const float* hs;           // [M*9, 4]
  __nv_bfloat16* y;          // [M*9, 2048] per-route contributions (row token*9 + k)
  __nv_bfloat16* out;        // [M, 2048]
  unsigned* counters;        // moe_down: [32][128] zeroed once, self-resetting
  const int* num_slots;
  const int* slot_expert;
  const int* slot_start;
  const int* route_token;
  const int* route_dst;
  const float* route_w;
  int M;
  int routes_per_token;
  uint8_t* dbg_hq;           // fused moe_down: copy of h_q [M*9, 512] when non-null (tests)
  float* dbg_hs;             // [M*9, 4]
};

extern "C" __device__ unsigned int netra_params_layout[] = {
    sizeof(GemmParamsV3), offsetof(GemmParamsV3, w13), offsetof(GemmParamsV3, w13_scale),
    offsetof(GemmParamsV3, w2), offsetof(GemmParamsV3, w2_scale), offsetof(GemmParamsV3, xq),
    offsetof(GemmParamsV3, xs), offsetof(GemmParamsV3, gu), offsetof(GemmParamsV3, hq),
    offsetof(GemmParamsV3, hs), offsetof(GemmParamsV3, y), offsetof(GemmParamsV3, out),
    offsetof(GemmParamsV3, counters), offsetof(GemmParamsV3, num_slots), offsetof(GemmParamsV3, slot_expert),
    offsetof(GemmParamsV3, slot_start), offsetof(GemmParamsV3, route_token), offsetof(GemmParamsV3, route_dst),
    offsetof(GemmParamsV3, route_w), offsetof(GemmParamsV3, M), offsetof(GemmParamsV3, routes_per_token),
    offsetof(GemmParamsV3, dbg_hq), offsetof(GemmParamsV3, dbg_hs)};

namespace {

// ---------------------------------------------------------------- MMA (moe_common.cuh, as v1)
using moe::kblock_mma;
using moe::load_b;
__device__ __forceinline__ void load_a_smem(uint4 (&a)[4], const uint8_t* row_g, int row_stride) {
  moe::load_a(a, row_g, row_stride);
}

__device__ __forceinline__ void item_range(int total, int& begin, int& end) {
  begin = (int)(((long long)blockIdx.x * total) / gridDim.x);
  end = (int)(((long long)(blockIdx.x + 1) * total) / gridDim.x);
}

#if TSPLIT
// Item map for token-split builds: slot s owns items [istart[s], istart[s+1]), per_slot row tiles per
// token chunk of tch tokens (at least one chunk per slot), chunk-major inside a slot so that items a
// warp takes (j, j + NCW, ...) mostly share their chunk (the fused-h cache). Every thread of the CTA
// calls it (it holds __syncthreads). slot_start is read through L2: moe_down calls it before its
// griddepcontrol.wait, on moe_align's metadata (two kernels back, see the header).
__device__ int build_item_map(int* istart, const int* slot_start, int nslots, int per_slot, int tch) {
  for (int s = threadIdx.x; s < nslots; s += blockDim.x) {
    const int c = __ldcg(slot_start + s + 1) - __ldcg(slot_start + s);
    istart[s + 1] = max(1, (c + tch - 1) / tch);
  }
  if (threadIdx.x == 0) istart[0] = 0;
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    int carry = 0;
    for (int b0 = 0; b0 < nslots; b0 += 32) {
      const int i = b0 + lane;
      int v = i < nslots ? istart[i + 1] : 0;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int u = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += u;
      }
      if (i < nslots) istart[i + 1] = (carry + v) * per_slot;
      carry += __shfl_sync(0xffffffffu, v, 31);
    }
  }
  __syncthreads();
  return istart[nslots];
}
__device__ __forceinline__ void map_item(const int* istart, int nslots, int per_slot, int it, int& slot, int& rt,
                                         int& chunk) {
  int lo = 0, hi = nslots - 1;  // the last slot whose first item is <= it
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (istart[mid] <= it) lo = mid; else hi = mid - 1;
  }
  slot = lo;
  const int rel = it - istart[lo];
  chunk = rel / per_slot;
  rt = rel % per_slot;
}
#endif

#if DN_BATCH
// Top-k arrivals of one chunk (rows routes from route index rb, 64-column tile nt), the caller having
// fenced (release) its y stores: the arrival that completes a (tile, token) sums that token's routes
// in rank order into out and resets the counter. Same code as the inline DN_PIPE epilogue.
__device__ __forceinline__ void topk_arrive(const GemmParamsV3& p, int nt, int rb, int rows, int lane) {
  bool last = false;
  int tok = 0;
  if (lane < rows) {
    tok = __ldg(p.route_token + rb + lane);
    const unsigned prev = atomicAdd(&p.counters[nt * MAX_TOKENS + tok], 1u);
    last = prev == (unsigned)p.routes_per_token - 1u;
  }
  unsigned mask = __ballot_sync(0xffffffffu, last);
  if (mask) fence_acq_rel_gpu();
  while (mask) {
    const int src = __ffs(mask) - 1;
    mask &= mask - 1;
    const int tk = __shfl_sync(0xffffffffu, tok, src);
    const int col = nt * 64 + 2 * lane;
    float s0 = 0.0f, s1 = 0.0f;
    unsigned v[ROUTE_STRIDE];
#pragma unroll
    for (int k = 0; k < ROUTE_STRIDE; ++k)
      v[k] = k < p.routes_per_token
                 ? __ldcg(reinterpret_cast<const unsigned*>(p.y + (size_t)(tk * ROUTE_STRIDE + k) * HID + col))
                 : 0u;
#pragma unroll
    for (int k = 0; k < ROUTE_STRIDE; ++k) {
      if (k < p.routes_per_token) {
        const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v[k]));
        s0 += f.x;
        s1 += f.y;
      }
    }
    *reinterpret_cast<__nv_bfloat162*>(p.out + (size_t)tk * HID + col) = __floats2bfloat162_rn(s0, s1);
    if (lane == src) p.counters[nt * MAX_TOKENS + tk] = 0u;
  }
}
#endif

}  // namespace

// ================================================================================ gate_up
// Item = (slot, 16-row tile rt of the 1024 gate|up rows); the consumer warp walks the full K
// (16 blocks) for 8 tokens per pass and writes the BF16 gate|up cache (route order) as v1.
extern "C" __global__ void __launch_bounds__(GU_THREADS, 1) moe_gate_up_v3(const GemmParamsV3 p) {
  extern __shared__ __align__(1024) uint8_t smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + GU_STAGES * ITEM_BYTES);
  uint64_t* empty = full + GU_STAGES;
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  if (tid == 0) {
    for (int s = 0; s < GU_STAGES; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 1);
    }
    mbar_fence_init();
  }
  __syncthreads();
  pdl_wait();     // metadata and x_q come from moe_align / moe_route
  pdl_trigger();  // after the wait: see the header (moe_down relies on it)
  const int nslots = *p.num_slots;
  int begin, end;
#if TSPLIT
  __shared__ int istart[MAX_SLOTS + 1];
  item_range(build_item_map(istart, p.slot_start, nslots, GU_ITEMS_PER_SLOT, 8), begin, end);
#else
  item_range(nslots * GU_ITEMS_PER_SLOT, begin, end);
#endif
  const int n = end - begin;

  if (wid == GU_NCW) {  // producer
    if (lane == 0) {
      for (int j = 0; j < n; ++j) {
        const int s = j % GU_STAGES;
        if (j >= GU_STAGES) mbar_wait(&empty[s], ((j / GU_STAGES) - 1) & 1);
#if TSPLIT
        int slot, rt, chunk;
        map_item(istart, nslots, GU_ITEMS_PER_SLOT, begin + j, slot, rt, chunk);
#else
        const int it = begin + j, slot = it / GU_ITEMS_PER_SLOT, rt = it % GU_ITEMS_PER_SLOT;
#endif
        const int e = __ldg(p.slot_expert + slot);
        mbar_expect_tx(&full[s], ITEM_BYTES);
        bulk_g2s(smem + s * ITEM_BYTES, p.w13 + ((size_t)e * 1024 + rt * 16) * HID, ITEM_BYTES, &full[s]);
      }
    }
    return;
  }

  const int g = lane >> 2, t = lane & 3;
#if GU_PIPE
  // Pipelined consumer (tuning build -DGU_PIPE=1): the per-item metadata is fetched one item ahead
  // (first level -- slot_expert / slot_start -- when the previous item starts, second level -- block
  // scales, first token id -- once its weights landed), and the token (B) fragments are double-
  // buffered over the 4 K quarters, so quarter kq+1's global loads are in flight while quarter kq's
  // MMAs run (run7 ncu: 60% of gate_up's stall cycles waited on these L1-hit loads).
  // item -> (slot, row tile, first token of its chunk); without TSPLIT an item covers all the slot's tokens
  auto locate = [&](int jj, int& slot, int& rt, int& cb) {
#if TSPLIT
    int chunk;
    map_item(istart, nslots, GU_ITEMS_PER_SLOT, begin + jj, slot, rt, chunk);
    cb = chunk * 8;
#else
    slot = (begin + jj) / GU_ITEMS_PER_SLOT;
    rt = (begin + jj) % GU_ITEMS_PER_SLOT;
    cb = 0;
#endif
  };
  int nx_e = 0, nx_r0 = 0, nx_r1 = 0, nx_tok = 0, nx_rt = 0, nx_cb = 0;
  float nx_wsl = 0.0f;
  if (wid < n) {
    int slot;
    locate(wid, slot, nx_rt, nx_cb);
    nx_e = __ldg(p.slot_expert + slot);
    nx_r0 = __ldg(p.slot_start + slot);
    nx_r1 = __ldg(p.slot_start + slot + 1);
    nx_wsl = lane < 16 ? __ldg(p.w13_scale + ((size_t)nx_e * 8 + (nx_rt * 16) / 128) * 16 + lane) : 0.0f;
    nx_tok = nx_cb + g < nx_r1 - nx_r0 ? __ldg(p.route_token + nx_r0 + nx_cb + g) : 0;
  }
  for (int j = wid; j < n; j += GU_NCW) {
    const int s = j % GU_STAGES;
    const int rt = nx_rt, r0 = nx_r0, cnt = nx_r1 - nx_r0, tok0 = nx_tok, cb = nx_cb;
#if TSPLIT
    const int cend = min(cnt, cb + 8);
#else
    const int cend = cnt;
#endif
    const float wsl = nx_wsl;
    const int jn = j + GU_NCW;
    const bool more = jn < n;
    if (more) {  // first level of the next item
      int slot;
      locate(jn, slot, nx_rt, nx_cb);
      nx_e = __ldg(p.slot_expert + slot);
      nx_r0 = __ldg(p.slot_start + slot);
      nx_r1 = __ldg(p.slot_start + slot + 1);
    }
    const int n0 = rt * 16;
    mbar_wait(&full[s], (j / GU_STAGES) & 1);
    if (more) {  // second level of the next item (its first level has landed during the wait)
      nx_wsl = lane < 16 ? __ldg(p.w13_scale + ((size_t)nx_e * 8 + (nx_rt * 16) / 128) * 16 + lane) : 0.0f;
      nx_tok = nx_cb + g < nx_r1 - nx_r0 ? __ldg(p.route_token + nx_r0 + nx_cb + g) : 0;
    }
    const uint8_t* tile = smem + s * ITEM_BYTES + g * HID + t * 32;
    for (int c0 = cb; c0 < cend; c0 += 8) {
      const int col = c0 + g;
      const bool valid = col < cend;
      const int tok = c0 == cb ? tok0 : (valid ? __ldg(p.route_token + r0 + col) : 0);
      const uint8_t* xrow = p.xq + (size_t)tok * HID + t * 32;
      const float* xsr = p.xs + tok * (HID / 128);
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
      uint32_t b[2][4][8];
      float st[2][4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        load_b(xrow + u * 128, valid, b[0][u]);
        st[0][u] = valid ? xsr[u] : 0.0f;
      }
#pragma unroll
      for (int kq = 0; kq < 4; ++kq) {
        if (kq + 1 < 4) {
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            load_b(xrow + ((kq + 1) * 4 + u) * 128, valid, b[(kq + 1) & 1][u]);
            st[(kq + 1) & 1][u] = valid ? xsr[(kq + 1) * 4 + u] : 0.0f;
          }
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int kb = kq * 4 + u;
          uint4 a[4];
          load_a_smem(a, tile + kb * 128, HID);
          kblock_mma(acc, a, b[kq & 1][u], __shfl_sync(0xffffffffu, wsl, kb), st[kq & 1][u], t);
        }
      }
      if (c0 + 8 >= cend) {  // last token tile: the stage has been read (MMA operands are in registers)
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[s]);
      }
#pragma unroll
      for (int z = 0; z < 4; ++z) {
        const int c = c0 + 2 * t + (z & 1), row = n0 + g + (z >> 1) * 8;
        if (c < cend) p.gu[(size_t)(r0 + c) * 1024 + row] = __float2bfloat16_rn(acc[z]);
      }
    }
    if (cend <= cb) {  // empty item (cannot happen): keeps the ring in phase regardless
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);
    }
  }
#else
  for (int j = wid; j < n; j += GU_NCW) {
    const int s = j % GU_STAGES;
    const int it = begin + j, slot = it / GU_ITEMS_PER_SLOT, rt = it % GU_ITEMS_PER_SLOT;
    const int e = __ldg(p.slot_expert + slot);
    const int r0 = __ldg(p.slot_start + slot), cnt = __ldg(p.slot_start + slot + 1) - r0;
    const int n0 = rt * 16;
    // the 16 block scales of this row tile (one per K block), lane kb holds block kb
    const float wsl = lane < 16 ? __ldg(p.w13_scale + ((size_t)e * 8 + n0 / 128) * 16 + lane) : 0.0f;
    mbar_wait(&full[s], (j / GU_STAGES) & 1);
    const uint8_t* tile = smem + s * ITEM_BYTES + g * HID + t * 32;
    for (int c0 = 0; c0 < cnt; c0 += 8) {
      const int col = c0 + g;
      const bool valid = col < cnt;
      const int tok = valid ? __ldg(p.route_token + r0 + col) : 0;
      const uint8_t* xrow = p.xq + (size_t)tok * HID + t * 32;
      const float* xsr = p.xs + tok * (HID / 128);
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int kq = 0; kq < 4; ++kq) {
        uint32_t b[4][8];
        float st[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          load_b(xrow + (kq * 4 + u) * 128, valid, b[u]);
          st[u] = valid ? xsr[kq * 4 + u] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int kb = kq * 4 + u;
          uint4 a[4];
          load_a_smem(a, tile + kb * 128, HID);
          kblock_mma(acc, a, b[u], __shfl_sync(0xffffffffu, wsl, kb), st[u], t);
        }
      }
      if (c0 + 8 >= cnt) {  // last token tile: the stage has been read (MMA operands are in registers)
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[s]);
      }
      // fragment: rows g / g+8, columns (tokens) 2t / 2t+1
#pragma unroll
      for (int z = 0; z < 4; ++z) {
        const int c = c0 + 2 * t + (z & 1), row = n0 + g + (z >> 1) * 8;
        if (c < cnt) p.gu[(size_t)(r0 + c) * 1024 + row] = __float2bfloat16_rn(acc[z]);
      }
    }
    if (cnt <= 0) {  // cannot happen (active slots have routes); keeps the ring in phase regardless
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);
    }
  }
#endif
}

// ================================================================================ down
// Item = (slot, 64-row tile nt of the 2048 output rows) x K 512: 4 row tiles of 16 x 4 K blocks.
// Tokens in chunks of 16 (two 8-token MMA tiles).
extern "C" __global__ void __launch_bounds__(DN_THREADS, 1) moe_down_v3(const GemmParamsV3 p) {
  extern __shared__ __align__(1024) uint8_t smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + DN_STAGES * ITEM_BYTES + DN_NCW * HBUF_BYTES);
  uint64_t* empty = full + DN_STAGES;
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  if (tid == 0) {
    for (int s = 0; s < DN_STAGES; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 1);
    }
    mbar_fence_init();
  }
  __syncthreads();
  // Slot metadata is from moe_align (two kernels back): final here, see the header. Read through L2
  // (ld.global.cg), never through the non-coherent path, before the wait.
  const int nslots = __ldcg(p.num_slots);
  int begin, end;
#if TSPLIT
  __shared__ int istart[MAX_SLOTS + 1];
  item_range(build_item_map(istart, p.slot_start, nslots, DN_ITEMS_PER_SLOT, HCHUNK), begin, end);
#else
  item_range(nslots * DN_ITEMS_PER_SLOT, begin, end);
#endif
  const int n = end - begin;

  if (wid == DN_NCW) {  // producer: streams w2 before waiting for moe_gate_up
    if (lane == 0) {
      for (int j = 0; j < n; ++j) {
        const int s = j % DN_STAGES;
        if (j >= DN_STAGES) mbar_wait(&empty[s], ((j / DN_STAGES) - 1) & 1);
#if TSPLIT
        int slot, nt, chunk;
        map_item(istart, nslots, DN_ITEMS_PER_SLOT, begin + j, slot, nt, chunk);
#else
        const int it = begin + j, slot = it / DN_ITEMS_PER_SLOT, nt = it % DN_ITEMS_PER_SLOT;
#endif
        const int e = __ldcg(p.slot_expert + slot);
        mbar_expect_tx(&full[s], ITEM_BYTES);
        bulk_g2s(smem + s * ITEM_BYTES, p.w2 + ((size_t)e * HID + nt * 64) * INTER, ITEM_BYTES, &full[s]);
      }
    }
    pdl_wait();
    pdl_trigger();
    return;
  }
  pdl_wait();  // gu (fused) or hq/hs (unfused) come from the previous kernel
  pdl_trigger();

  const int g = lane >> 2, t = lane & 3;
#if MOE_FUSE_ACT
  uint8_t* hbuf = smem + DN_STAGES * ITEM_BYTES + wid * HBUF_BYTES;
  float* hsc = reinterpret_cast<float*>(hbuf + HCHUNK * HROW);
  int cached_slot = -1, cached_c0 = -1;
#endif
#if DN_BATCH
  bool pend = false;  // a chunk whose top-k arrivals wait for the next chunk's fence
  int p_nt = 0, p_rb = 0, p_rows = 0;
#endif
  for (int j = wid; j < n; j += DN_NCW) {
    const int s = j % DN_STAGES;
#if TSPLIT
    int slot, nt, chunk;
    map_item(istart, nslots, DN_ITEMS_PER_SLOT, begin + j, slot, nt, chunk);
#else
    const int it = begin + j, slot = it / DN_ITEMS_PER_SLOT, nt = it % DN_ITEMS_PER_SLOT;
#endif
    const int e = __ldg(p.slot_expert + slot);
    const int r0 = __ldg(p.slot_start + slot), cnt = __ldg(p.slot_start + slot + 1) - r0;
    // block scales: 4 row tiles of 16 are in 128-row block (nt*64)/128; lane kb < 4 holds block kb
    const float wsl = lane < 4 ? __ldg(p.w2_scale + ((size_t)e * 16 + (nt * 64) / 128) * 4 + lane) : 0.0f;
    float wsk[4];
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) wsk[kb] = __shfl_sync(0xffffffffu, wsl, kb);
    bool waited = false;
#if TSPLIT
    const int cend = min(cnt, (chunk + 1) * HCHUNK);
    for (int c0 = chunk * HCHUNK; c0 < cend; c0 += HCHUNK) {
#else
    for (int c0 = 0; c0 < cnt; c0 += HCHUNK) {
#endif
      const int rows = min(HCHUNK, cnt - c0);
#if MOE_FUSE_ACT
      if (slot != cached_slot || c0 != cached_c0) {
        __syncwarp();
        // h for routes r0+c0 .. +rows: one half-warp per (row, group of 128), 8 values per lane,
        // exactly as moe_act_quant.
        const int hw = lane >> 4, sub = lane & 15;
#if DN_PIPE
        // 4 (row, group) pairs per half-warp per round: their gate|up loads are all in flight before
        // any use (the loop trip count is warp-uniform: rows * 4 is even).
        for (int idx0 = hw; idx0 < rows * 4; idx0 += 8) {
          uint4 gvs[4], uvs[4];
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            const int idx = idx0 + 2 * u;
            if (idx < rows * 4) {
              const __nv_bfloat16* src = p.gu + (size_t)(r0 + c0 + (idx >> 2)) * 1024 + (idx & 3) * 128 + sub * 8;
              gvs[u] = __ldcg(reinterpret_cast<const uint4*>(src));
              uvs[u] = __ldcg(reinterpret_cast<const uint4*>(src + 512));
            }
          }
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            const int idx = idx0 + 2 * u;
            if (idx >= rows * 4) break;
            const int row = idx >> 2, grp = idx & 3, col = grp * 128 + sub * 8;
            const size_t r = (size_t)(r0 + c0 + row);
            const uint4 gv = gvs[u], uv = uvs[u];
            float gf[8], uf[8], h[8];
            moe::bf16x8_to_float(gv, gf);
            moe::bf16x8_to_float(uv, uf);
            float amax = 0.0f;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
              h[i] = __bfloat162float(__float2bfloat16_rn(moe::silu_mul(gf[i], uf[i])));
              amax = fmaxf(amax, fabsf(h[i]));
            }
#pragma unroll
            for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
            const float sc = moe::group_scale(amax);
            uint2 q;
            q.x = moe::quant4(h[0], h[1], h[2], h[3], sc);
            q.y = moe::quant4(h[4], h[5], h[6], h[7], sc);
            *reinterpret_cast<uint2*>(hbuf + row * HROW + col) = q;
            if (sub == 0) hsc[row * 4 + grp] = sc;
            if (p.dbg_hq != nullptr) {
              *reinterpret_cast<uint2*>(p.dbg_hq + r * 512 + col) = q;
              if (sub == 0) p.dbg_hs[r * 4 + grp] = sc;
            }
          }
        }
#else
        for (int idx = hw; idx < rows * 4; idx += 2) {
          const int row = idx >> 2, grp = idx & 3, col = grp * 128 + sub * 8;
          const size_t r = (size_t)(r0 + c0 + row);
          const __nv_bfloat16* src = p.gu + r * 1024;
          const uint4 gv = __ldcg(reinterpret_cast<const uint4*>(src + col));
          const uint4 uv = __ldcg(reinterpret_cast<const uint4*>(src + 512 + col));
          float gf[8], uf[8], h[8];
          moe::bf16x8_to_float(gv, gf);
          moe::bf16x8_to_float(uv, uf);
          float amax = 0.0f;
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            h[i] = __bfloat162float(__float2bfloat16_rn(moe::silu_mul(gf[i], uf[i])));
            amax = fmaxf(amax, fabsf(h[i]));
          }
#pragma unroll
          for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
          const float sc = moe::group_scale(amax);
          uint2 q;
          q.x = moe::quant4(h[0], h[1], h[2], h[3], sc);
          q.y = moe::quant4(h[4], h[5], h[6], h[7], sc);
          *reinterpret_cast<uint2*>(hbuf + row * HROW + col) = q;
          if (sub == 0) hsc[row * 4 + grp] = sc;
          if (p.dbg_hq != nullptr) {
            *reinterpret_cast<uint2*>(p.dbg_hq + r * 512 + col) = q;
            if (sub == 0) p.dbg_hs[r * 4 + grp] = sc;
          }
        }
#endif
        __syncwarp();
        cached_slot = slot;
        cached_c0 = c0;
      }
#endif
      if (!waited) {
        mbar_wait(&full[s], (j / DN_STAGES) & 1);
        waited = true;
      }
      const uint8_t* tile = smem + s * ITEM_BYTES + g * INTER + t * 32;
      float acc[4][HTILES][4];
#pragma unroll
      for (int q = 0; q < 4; ++q)
#pragma unroll
        for (int i = 0; i < HTILES; ++i)
#pragma unroll
          for (int z = 0; z < 4; ++z) acc[q][i][z] = 0.0f;
#if DN_PIPE
      uint32_t b[4][HTILES][8];  // all 4 K blocks' token fragments loaded before the first MMA
      float st[4][HTILES];
#pragma unroll
      for (int kb = 0; kb < 4; ++kb) {
#pragma unroll
        for (int i = 0; i < HTILES; ++i) {
          const int lc = i * 8 + g;
          const bool valid = lc < rows;
#if MOE_FUSE_ACT
          load_b(hbuf + lc * HROW + kb * 128 + t * 32, valid, b[kb][i]);
          st[kb][i] = valid ? hsc[lc * 4 + kb] : 0.0f;
#else
          const size_t r = (size_t)(r0 + c0 + (valid ? lc : 0));
          load_b(p.hq + r * INTER + kb * 128 + t * 32, valid, b[kb][i]);
          st[kb][i] = valid ? p.hs[r * 4 + kb] : 0.0f;
#endif
        }
      }
#pragma unroll
      for (int kb = 0; kb < 4; ++kb) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          uint4 a[4];
          load_a_smem(a, tile + q * 16 * INTER + kb * 128, INTER);
#pragma unroll
          for (int i = 0; i < HTILES; ++i)
            if (i * 8 < rows) kblock_mma(acc[q][i], a, b[kb][i], wsk[kb], st[kb][i], t);  // warp-uniform
        }
      }
#else
#pragma unroll
      for (int kb = 0; kb < 4; ++kb) {
        uint32_t b[HTILES][8];
        float st[HTILES];
#pragma unroll
        for (int i = 0; i < HTILES; ++i) {
          const int lc = i * 8 + g;  // column inside the chunk
          const bool valid = lc < rows;
#if MOE_FUSE_ACT
          load_b(hbuf + lc * HROW + kb * 128 + t * 32, valid, b[i]);
          st[i] = valid ? hsc[lc * 4 + kb] : 0.0f;
#else
          const size_t r = (size_t)(r0 + c0 + (valid ? lc : 0));
          load_b(p.hq + r * INTER + kb * 128 + t * 32, valid, b[i]);
          st[i] = valid ? p.hs[r * 4 + kb] : 0.0f;
#endif
        }
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          uint4 a[4];
          load_a_smem(a, tile + q * 16 * INTER + kb * 128, INTER);
#pragma unroll
          for (int i = 0; i < HTILES; ++i)
            if (i * 8 < rows) kblock_mma(acc[q][i], a, b[i], wsk[kb], st[i], t);  // warp-uniform
        }
      }
#endif
      // last chunk (of the item): the stage has been read; release it before the epilogue
#if TSPLIT
      if (c0 + HCHUNK >= cend) {
#else
      if (c0 + HCHUNK >= cnt) {
#endif
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[s]);
      }
      // y rows (route dst) x 64 columns; each route's contribution weighted in FP32, rounded to BF16.
#pragma unroll
      for (int i = 0; i < HTILES; ++i) {
#pragma unroll
        for (int cz = 0; cz < 2; ++cz) {
          const int lc = i * 8 + 2 * t + cz;
          if (lc < rows) {
            const int r = r0 + c0 + lc;
            const float w = __ldg(p.route_w + r);
            __nv_bfloat16* yr = p.y + (size_t)__ldg(p.route_dst + r) * HID + nt * 64 + g;
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              yr[q * 16] = __float2bfloat16_rn(acc[q][i][cz] * w);
              yr[q * 16 + 8] = __float2bfloat16_rn(acc[q][i][2 + cz] * w);
            }
          }
        }
      }
#if DN_BATCH
      // Arrivals of this chunk and the warp's previous one under one release fence (every lane fences
      // its own y stores); an odd chunk stays pending until the next one or the end of the loop.
      if (!pend) {
        pend = true;
        p_nt = nt;
        p_rb = r0 + c0;
        p_rows = rows;
      } else {
        fence_acq_rel_gpu();
        __syncwarp();
        topk_arrive(p, p_nt, p_rb, p_rows, lane);
        topk_arrive(p, nt, r0 + c0, rows, lane);
        pend = false;
      }
#else
      // Top-k arrivals: one per (route, 64-column tile). Every lane fences its own y stores first.
      fence_acq_rel_gpu();
      __syncwarp();
      bool last = false;
      int tok = 0;
      if (lane < rows) {
        tok = __ldg(p.route_token + r0 + c0 + lane);
        const unsigned prev = atomicAdd(&p.counters[nt * MAX_TOKENS + tok], 1u);
        last = prev == (unsigned)p.routes_per_token - 1u;
      }
      unsigned mask = __ballot_sync(0xffffffffu, last);
      if (mask) fence_acq_rel_gpu();
      while (mask) {
        const int src = __ffs(mask) - 1;
        mask &= mask - 1;
        const int tk = __shfl_sync(0xffffffffu, tok, src);
        const int col = nt * 64 + 2 * lane;
        float s0 = 0.0f, s1 = 0.0f;
#if DN_PIPE
        unsigned v[ROUTE_STRIDE];  // all routes' loads in flight, then summed in rank order (same result)
#pragma unroll
        for (int k = 0; k < ROUTE_STRIDE; ++k)
          v[k] = k < p.routes_per_token
                     ? __ldcg(reinterpret_cast<const unsigned*>(p.y + (size_t)(tk * ROUTE_STRIDE + k) * HID + col))
                     : 0u;
#pragma unroll
        for (int k = 0; k < ROUTE_STRIDE; ++k) {
          if (k < p.routes_per_token) {
            const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v[k]));
            s0 += f.x;
            s1 += f.y;
          }
        }
#else
        for (int k = 0; k < p.routes_per_token; ++k) {
          const unsigned v = __ldcg(reinterpret_cast<const unsigned*>(p.y + (size_t)(tk * ROUTE_STRIDE + k) * HID + col));
          const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
          s0 += f.x;
          s1 += f.y;
        }
#endif
        *reinterpret_cast<__nv_bfloat162*>(p.out + (size_t)tk * HID + col) = __floats2bfloat162_rn(s0, s1);
        if (lane == src) p.counters[nt * MAX_TOKENS + tk] = 0u;
      }
#endif
    }
    if (cnt <= 0) {  // cannot happen (active slots have routes); keeps the ring in phase regardless
      mbar_wait(&full[s], (j / DN_STAGES) & 1);
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);
    }
  }
#if DN_BATCH
  if (pend) {
    fence_acq_rel_gpu();
    __syncwarp();
    topk_arrive(p, p_nt, p_rb, p_rows, lane);
  }
#endif
}

#if DN_STREAM
// ================================================================================ down, streaming (round 3)
// Same items, ring, MMAs and numerics as the TSPLIT moe_down_v3 above; what changes is everything around
// the weight stream, so that the consumer warps release stages as fast as the copy engine fills them:
// * h per group, once per CTA: a group is (slot, HCHUNK-token chunk) = the 32 items of its 64-row tiles
//   (items are chunk-major inside a slot, so a CTA's contiguous item range is a run of groups). All
//   consumer warps compute a group's h (as moe_act_quant, bitwise) into one of two shared group buffers;
//   one named barrier per group; group g+1's h is computed before group g's items, into the other buffer.
// * No fence / atomic in the item loop: an item only stores its y rows. After the loop every CTA arrives
//   once on a counter (workspace word 0); the CTAs with the last K tickets (K = ceil(M*256 / threads),
//   at most gridDim / 2) wait for the full count and sum the top-k routes for slices of (token, 8 columns),
//   in rank order in FP32 (as v1: the same bits); the others exit. Only K <= gridDim / 2 CTAs ever wait, so
//   no co-residency is assumed; a wait that cannot end traps instead of hanging. Word 32 counts the
//   summing CTAs out; the last resets both words (self-resetting). The words are touched only after
//   griddepcontrol.wait (the previous launch of this kernel completed before moe_align, two back, ran).
#if !TSPLIT
#error "DN_STREAM needs TSPLIT (and so GU_PIPE)"
#endif
#define DN_GBUF (HCHUNK * HROW + HCHUNK * 4 * 4)
namespace {
__device__ __forceinline__ void consumer_bar() {
  asm volatile("bar.sync 1, %0;\n" ::"r"(DN_NCW * 32) : "memory");
}
// h of group gi (slot, chunk) into hb: (row, 128-group) pairs over the consumer half-warps, up to 4 pairs'
// gate|up loads in flight per half-warp. Trip counts are warp-uniform (rows * 4 is even).
__device__ void dn_group_h(const GemmParamsV3& p, const int* istart, int nslots, int gi, uint8_t* hb, int wid,
                           int lane) {
  int slot, rt, chunk;
  map_item(istart, nslots, DN_ITEMS_PER_SLOT, gi * DN_ITEMS_PER_SLOT, slot, rt, chunk);
  const int r0 = __ldg(p.slot_start + slot), cnt = __ldg(p.slot_start + slot + 1) - r0;
  const int c0 = chunk * HCHUNK, rows = min(HCHUNK, cnt - c0);
  float* hsc = reinterpret_cast<float*>(hb + HCHUNK * HROW);
  const int hw = lane >> 4, sub = lane & 15;
  for (int idx0 = 2 * wid + hw; idx0 < rows * 4; idx0 += 8 * DN_NCW) {
    uint4 gvs[4], uvs[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int idx = idx0 + 2 * DN_NCW * u;
      if (idx < rows * 4) {
        const __nv_bfloat16* src = p.gu + (size_t)(r0 + c0 + (idx >> 2)) * 1024 + (idx & 3) * 128 + sub * 8;
        gvs[u] = __ldcg(reinterpret_cast<const uint4*>(src));
        uvs[u] = __ldcg(reinterpret_cast<const uint4*>(src + 512));
      }
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int idx = idx0 + 2 * DN_NCW * u;
      if (idx >= rows * 4) break;
      const int row = idx >> 2, grp = idx & 3, col = grp * 128 + sub * 8;
      const size_t r = (size_t)(r0 + c0 + row);
      float gf[8], uf[8], h[8];
      moe::bf16x8_to_float(gvs[u], gf);
      moe::bf16x8_to_float(uvs[u], uf);
      float amax = 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        h[i] = __bfloat162float(__float2bfloat16_rn(moe::silu_mul(gf[i], uf[i])));
        amax = fmaxf(amax, fabsf(h[i]));
      }
#pragma unroll
      for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      const float sc = moe::group_scale(amax);
      uint2 q;
      q.x = moe::quant4(h[0], h[1], h[2], h[3], sc);
      q.y = moe::quant4(h[4], h[5], h[6], h[7], sc);
      *reinterpret_cast<uint2*>(hb + row * HROW + col) = q;
      if (sub == 0) hsc[row * 4 + grp] = sc;
      if (p.dbg_hq != nullptr) {
        *reinterpret_cast<uint2*>(p.dbg_hq + r * 512 + col) = q;
        if (sub == 0) p.dbg_hs[r * 4 + grp] = sc;
      }
    }
  }
}
}  // namespace

extern "C" __global__ void __launch_bounds__(DN_THREADS, 1) moe_down_v3_stream(const GemmParamsV3 p) {
  extern __shared__ __align__(1024) uint8_t smem[];
  uint8_t* gbuf = smem + DN_STAGES * ITEM_BYTES;  // two group h buffers
  uint64_t* full = reinterpret_cast<uint64_t*>(gbuf + 2 * DN_GBUF);
  uint64_t* empty = full + DN_STAGES;
  __shared__ int istart[MAX_SLOTS + 1];
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  if (tid == 0) {
    for (int s = 0; s < DN_STAGES; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 1);
    }
    mbar_fence_init();
  }
  __syncthreads();
  // num_slots / slot_start / slot_expert are moe_align's (two kernels back): final here, see the header.
  const int nslots = __ldcg(p.num_slots);
  int begin, end;
  item_range(build_item_map(istart, p.slot_start, nslots, DN_ITEMS_PER_SLOT, HCHUNK), begin, end);
  const int n = end - begin;

  if (wid == DN_NCW) {  // producer: streams w2 before waiting for moe_gate_up
    if (lane == 0) {
      for (int j = 0; j < n; ++j) {
        const int s = j % DN_STAGES;
        if (j >= DN_STAGES) mbar_wait(&empty[s], ((j / DN_STAGES) - 1) & 1);
        int slot, nt, chunk;
        map_item(istart, nslots, DN_ITEMS_PER_SLOT, begin + j, slot, nt, chunk);
        const int e = __ldcg(p.slot_expert + slot);
        mbar_expect_tx(&full[s], ITEM_BYTES);
        bulk_g2s(smem + s * ITEM_BYTES, p.w2 + ((size_t)e * HID + nt * 64) * INTER, ITEM_BYTES, &full[s]);
      }
    }
    __syncwarp();
    pdl_wait();
    pdl_trigger();
  } else {
    pdl_wait();  // gu comes from moe_gate_up
    pdl_trigger();
    const int g = lane >> 2, t = lane & 3;
    if (n > 0) {
      const int g0 = begin / DN_ITEMS_PER_SLOT, g1 = (end - 1) / DN_ITEMS_PER_SLOT;
      dn_group_h(p, istart, nslots, g0, gbuf, wid, lane);
      consumer_bar();
      for (int gi = g0; gi <= g1; ++gi) {
        const uint8_t* hb = gbuf + ((gi - g0) & 1) * DN_GBUF;
        const float* hsc = reinterpret_cast<const float*>(hb + HCHUNK * HROW);
        if (gi < g1) dn_group_h(p, istart, nslots, gi + 1, gbuf + ((gi - g0 + 1) & 1) * DN_GBUF, wid, lane);
        int slot, rt0, chunk;
        map_item(istart, nslots, DN_ITEMS_PER_SLOT, gi * DN_ITEMS_PER_SLOT, slot, rt0, chunk);
        const int e = __ldg(p.slot_expert + slot);
        const int r0 = __ldg(p.slot_start + slot), cnt = __ldg(p.slot_start + slot + 1) - r0;
        const int c0 = chunk * HCHUNK, rows = min(HCHUNK, cnt - c0);
        // token fragments of the group: the same for every item of the group, loaded once per group
        uint32_t b[4][HTILES][8];
        float st[4][HTILES];
#pragma unroll
        for (int kb = 0; kb < 4; ++kb) {
#pragma unroll
          for (int i = 0; i < HTILES; ++i) {
            const int lc = i * 8 + g;
            const bool valid = lc < rows;
            load_b(hb + lc * HROW + kb * 128 + t * 32, valid, b[kb][i]);
            st[kb][i] = valid ? hsc[lc * 4 + kb] : 0.0f;
          }
        }
        // this lane's epilogue routes (columns 2t, 2t+1 of each token tile): weight and y row, once per group
        float rw[HTILES][2];
        int rdst[HTILES][2];
#pragma unroll
        for (int i = 0; i < HTILES; ++i)
#pragma unroll
          for (int cz = 0; cz < 2; ++cz) {
            const int lc = i * 8 + 2 * t + cz;
            rw[i][cz] = lc < rows ? __ldg(p.route_w + r0 + c0 + lc) : 0.0f;
            rdst[i][cz] = lc < rows ? __ldg(p.route_dst + r0 + c0 + lc) : 0;
          }
#if DN_WSG
        // w2 scale index of item nt, K block kb: (nt / 2) * 4 + kb in 0..63 -> lanes of ws_lo (0..31) / ws_hi
        const float ws_lo = __ldg(p.w2_scale + (size_t)e * 64 + lane);
        const float ws_hi = __ldg(p.w2_scale + (size_t)e * 64 + 32 + lane);
#endif
        const int ja = max(begin, gi * DN_ITEMS_PER_SLOT) - begin;
        const int jb = min(end, (gi + 1) * DN_ITEMS_PER_SLOT) - begin;
        for (int j = ja + (((wid - ja) % DN_NCW) + DN_NCW) % DN_NCW; j < jb; j += DN_NCW) {
          const int s = j % DN_STAGES;
          const int nt = begin + j - gi * DN_ITEMS_PER_SLOT;
#if DN_WSG
          const float wsrc = (nt >> 1) < 8 ? ws_lo : ws_hi;  // warp-uniform choice
          float wsk[4];
#pragma unroll
          for (int kb = 0; kb < 4; ++kb) wsk[kb] = __shfl_sync(0xffffffffu, wsrc, ((nt >> 1) & 7) * 4 + kb);
#else
          const float wsl = lane < 4 ? __ldg(p.w2_scale + ((size_t)e * 16 + (nt * 64) / 128) * 4 + lane) : 0.0f;
          float wsk[4];
#pragma unroll
          for (int kb = 0; kb < 4; ++kb) wsk[kb] = __shfl_sync(0xffffffffu, wsl, kb);
#endif
          mbar_wait(&full[s], (j / DN_STAGES) & 1);
          const uint8_t* tile = smem + s * ITEM_BYTES + g * INTER + t * 32;
          float acc[4][HTILES][4];
#pragma unroll
          for (int q = 0; q < 4; ++q)
#pragma unroll
            for (int i = 0; i < HTILES; ++i)
#pragma unroll
              for (int z = 0; z < 4; ++z) acc[q][i][z] = 0.0f;
#pragma unroll
          for (int kb = 0; kb < 4; ++kb) {
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              uint4 a[4];
              load_a_smem(a, tile + q * 16 * INTER + kb * 128, INTER);
#pragma unroll
              for (int i = 0; i < HTILES; ++i)
                if (i * 8 < rows) kblock_mma(acc[q][i], a, b[kb][i], wsk[kb], st[kb][i], t);  // warp-uniform
            }
          }
          __syncwarp();  // the stage has been read (operands in registers): release it before the stores
          if (lane == 0) mbar_arrive(&empty[s]);
#pragma unroll
          for (int i = 0; i < HTILES; ++i) {
#pragma unroll
            for (int cz = 0; cz < 2; ++cz) {
              const int lc = i * 8 + 2 * t + cz;
              if (lc < rows) {
                const float w = rw[i][cz];
                __nv_bfloat16* yr = p.y + (size_t)rdst[i][cz] * HID + nt * 64 + g;
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                  yr[q * 16] = __float2bfloat16_rn(acc[q][i][cz] * w);
                  yr[q * 16 + 8] = __float2bfloat16_rn(acc[q][i][2 + cz] * w);
                }
              }
            }
          }
        }
        consumer_bar();  // every warp is done with this group's buffer before group gi + 2 overwrites it
      }
    }
  }

  // ---- arrival, then the top-k sum by the last CTAs (all y rows of this launch are written)
  // Every CTA arrives once (ticket = arrival order). The first gridDim - K CTAs exit; the last K wait until
  // every CTA has arrived, then sum one slice each. No co-residency assumption: only K <= gridDim / 2 CTAs
  // ever wait, and they wait for CTAs that run or can take the SMs the exited CTAs freed. The K summing
  // CTAs count themselves out on a second word; the last one resets both (self-resetting, no memset).
  __shared__ unsigned s_ticket;
  __syncthreads();
  unsigned* arrive = p.counters;
  unsigned* done = p.counters + 32;
  if (tid == 0) {
    __threadfence();  // release this CTA's y stores (ordered before by the CTA barrier above)
    s_ticket = atomicAdd(arrive, 1u);
  }
  __syncthreads();
  const int units = p.M * (HID / 8);
  const unsigned nsum = (unsigned)max(1, min((int)gridDim.x / 2, (units + (int)blockDim.x - 1) / (int)blockDim.x));
  const unsigned ticket = s_ticket;
  if (ticket < gridDim.x - nsum) return;
#if DN_WSG
  const int rank = (int)(gridDim.x - 1u - ticket);  // rank 0 = the last arrival: sees the full count at once
#else
  const int rank = (int)(ticket - (gridDim.x - nsum));
#endif
  if (tid == 0) {
    unsigned polls = 0;
    while (ld_acquire_gpu(arrive) < gridDim.x) {
      __nanosleep(32);
      if (++polls == (1u << 23)) __trap();  // ~5 s: a broken arrival count, not a wait that can end
    }
    __threadfence();
    if (atomicAdd(done, 1u) == nsum - 1u) {  // every summing CTA has seen the full count: reset
      atomicExch(arrive, 0u);
      atomicExch(done, 0u);
    }
  }
  __syncthreads();
  for (int u = rank * blockDim.x + tid; u < units; u += nsum * blockDim.x) {
    const int tk = u / (HID / 8), col = (u % (HID / 8)) * 8;
    uint4 v[ROUTE_STRIDE];
#pragma unroll
    for (int k = 0; k < ROUTE_STRIDE; ++k)
      v[k] = k < p.routes_per_token
                 ? __ldcg(reinterpret_cast<const uint4*>(p.y + (size_t)(tk * ROUTE_STRIDE + k) * HID + col))
                 : make_uint4(0u, 0u, 0u, 0u);
    float s[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) s[i] = 0.0f;
#pragma unroll
    for (int k = 0; k < ROUTE_STRIDE; ++k) {
      if (k < p.routes_per_token) {
        const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&v[k]);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float2 f = __bfloat1622float2(h2[i]);
          s[2 * i] += f.x;
          s[2 * i + 1] += f.y;
        }
      }
    }
    uint4 o;
    __nv_bfloat162* o2 = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
    for (int i = 0; i < 4; ++i) o2[i] = __floats2bfloat162_rn(s[2 * i], s[2 * i + 1]);
    *reinterpret_cast<uint4*>(p.out + (size_t)tk * HID + col) = o;
  }
}
#endif
