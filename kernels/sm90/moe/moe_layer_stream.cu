// moe_layer_stream: the routed MoE layer (256 experts, top-8, FP8 block-scaled, width 512) for 2..128 tokens in ONE
// cooperative kernel with a continuous weight stream per SM. Two entry points of one template: moe_ml (contract
// moe_routed_stream: routed experts from given top-8 ids and weights) and moe_ml_shared (contract moe_block_stream:
// moe_route -> this, with the shared expert as a 9th route of every token: topk_ids[t, 8] = 256 with its sigmoid gate
// weight, expert 256 = the shared expert's weights sw13 / sw2, a slot of all M tokens after the routed slots; its
// weights stream once per 8-token chunk, the repeats from L2 (evict_last, as any expert with more than 8 tokens)).
//
// Plan: every operand moves through the TMA queue. Weights go through a 4 x 32 KB ring fed by one producer warp (6 deep
// across the gate_up -> down transition, in the freed x buffers); x rows and h rows plus the expert's scales go through
// two 33 KB "B buffers" fed by a second producer one chunk ahead, and the consumers quantize them in place (per token
// group of 128, moe_common.cuh), so neither x_q nor h_q makes a round trip through global memory.
// Work is split statically in contiguous, expert-major item ranges (a CTA sees ~2-3 experts per GEMM):
//   gate_up item = (slot, 8-token chunk, 8 columns): gate rows [8j, +8) and up rows [512 + 8j, +8) of the expert
//     (32 KB), one 16-row MMA tile whose rows g / g + 8 are gate / up of the same column, so h = bf16(SiLU(bf16 gate) *
//     bf16 up) is computed in the epilogue and written to hbuf in slot order;
//   down item = (slot, 8-token chunk, 64 output rows): w2 rows [64 r, +64) x 512 (32 KB).
//   An expert with more than 8 tokens streams its weights once per chunk (its copies carry L2 evict_last, every other
//   weight copy evict_first: weights are read once per decode step, and the policy keeps x / h / y and the counters in
//   L2 under the stream).
// Phases (grid = 128 CTAs, one per SM, cooperative; launched with programmatic dependent launch: every thread waits
// for the previous kernel at entry, then triggers its dependents, e.g. the next MoE block's route step):
//   0. route metadata in shared memory from the top-8 ids (slots = active experts by increasing id, tokens increasing
//      inside a slot, chunk tables, 256-thread scans); the producers start right after the slot tables; below 128
//      tokens the scan thread owning the CTA's first gate_up chunk issues its x rows and first weight item at once;
//   1. gate_up chunks: x rows quantized in place, then the items; after each chunk thread 0 adds the CTA's item count
//      of that chunk to the chunk's counter (workspace, release);
//   2. down chunks: the B producer copies down chunk i's h rows once gate_up chunk i has all 64 items counted (no grid
//      barrier between the GEMMs); h quantized in place, then the items: y = bf16(acc * w) per route (rank order);
//      from 32 tokens a CTA runs its own down chunks first; one grid barrier on a count that only grows (y complete);
//   3. top-k sum: out[t, 8 columns] = bf16(sum over k in rank order, FP32).
// A gate_up item's warp pair (warps 2s, 2s + 1: two SM sub-partitions) splits the 16 K blocks keeping one warp's
// numerics: one runs the scaled FP32 chain over K blocks 0-7 while the other runs the MMAs of blocks 8-15, then
// continues the chain in K order. A down item's pair splits the 4 row tiles.
// Numerics (netra/ops/moe_fp8.py moe_routed_ref): x and h quantized per token group of 128 (IEEE divisions, RNE), the
// swapped-operand mma.sync m16n8k32 e4m3 core (moe_common.cuh) with per-128-K-block FP32 scaling per (row, token)
// element in K order, gate/up rounded to BF16, y = bf16(acc * w), routes summed in rank order in FP32, rounded once.
// Protocols: ring stage s belongs to one warp pair (full/empty mbarriers, parity waits); B buffer b % 2 holds the
// CTA's b-th chunk (bfull: 1 arrival + tx bytes; bempty: 8 warp arrivals after that chunk's bfull, behind a proxy
// fence). Before each down chunk the B producer polls its gate_up chunk's counter (acquire), then issues a global
// proxy fence (hbuf is written by other CTAs' generic stores and read here by the async proxy).
// Workspace (zeroed once): word 64 the last grid barrier's count (only grows, 128 per launch), words 256.. the
// per-chunk counters (zeroed after the barrier). One stream at a time per device. The history of every choice (and
// of what was rejected) is in docs/moe.md and results/sm90/moe_rejected.json.
#include "moe_common.cuh"
#include "moe_sync.cuh"
#include <stddef.h>
// Adopted configuration (measured in results/sm90/moe_runs/*/README.md; docs/moe.md)
constexpr int ML_STAGES = 4;  // ring stages of 32 KB
constexpr int GCH = 8;
constexpr int DCH = 8;
constexpr int ML_XST_MAX_M = 1000;
constexpr int ML_PRE_ITEMS = 1;
constexpr int ML_OWNER_MAX_M = 128;
constexpr int ML_L2HINT = 2;
constexpr int ML_EARLY_GO = 1;
#define HID 2048
#define INTER 512
#define TOPK 8                        // routed ranks per token (moe_ml_shared: + the shared expert, TK = 9)
#define SHARED_E 256                  // the shared expert's id in moe_ml_shared's routes
#define ML_MAXM 128
#define ML_CTAS 128
#define ML_NCW (2 * ML_STAGES)        // consumer warps: a pair per ring stage
#define ML_THREADS (32 * (ML_NCW + 2))  // + weight producer + B producer
#define STAGE_BYTES 32768
#define HALF_BYTES 16384              // 8 rows x 2048 B
#define MAX_ROUTES (ML_MAXM * (TOPK + 1))  // 1152: the tables are sized for moe_ml_shared
#define MAX_GCHUNKS (257 + MAX_ROUTES / GCH)
static_assert(GCH == DCH, "a down chunk is the gate_up chunk of the same index (one chunk table)");
#define GU_PER_CHUNK 64               // 512 columns / 8
#define DN_PER_CHUNK 32               // 2048 rows / 64
#define XROW 4096                     // x row stride in a B buffer: BF16 as copied, E4M3 after the in-place quantization
#define HROW 1024                     // h row stride in a B buffer: BF16 as copied, E4M3 after the in-place quantization
// B buffer layout (gate_up chunk | down chunk), sizes for the default DCH 8 / 4 stages
#define B_XS (GCH * XROW)             // 32768: x_s [8][16] FP32
#define B_WS (B_XS + GCH * 16 * 4)    // 33280: w13 scales of the expert [8][16] FP32
#define B_HS (DCH * HROW)             // 8192: h_s [8][4] FP32
#define B_WS2 (B_HS + DCH * 4 * 4)    // 8320: w2 scales of the expert [16][4] FP32
#define ML_MAX(a, b) ((a) > (b) ? (a) : (b))
#define BBUF ((ML_MAX(B_WS + 512, B_WS2 + 256) + 127) / 128 * 128)   // 33792
static_assert(BBUF % 128 == 0, "B buffer layout");
#define OFF_RING 0
#define OFF_B (OFF_RING + ML_STAGES * STAGE_BYTES)   // 131072
#define OFF_XCH (OFF_B + 2 * BBUF)                    // 198656: gate_up pair exchange [2][pairs][4][32] FP32
                                      // 1: down item k in slot k % 6 all along (pairs 0 / 1 own two slots each); 2: only down
                                      // items 4 and 5 go to the extra slots (the gate_up -> down transition), then 4 slots again.
                                      // Either only below ML_XST_MAX_M tokens (else base's slots).
                                      // then launch_dependents
                                      // 2: also evict_first on every other weight copy (read once); 3: evict_first on all
#define HBUF (B_WS2 + 256)            // ML_XST: a down chunk's B buffer (8576)
#define ML_SLOTS_DN (ML_STAGES + 2)
#define OFF_BAR (OFF_XCH + 2 * HBUF)                  // 215808
#define ML_SMEM (OFF_BAR + 256)                       // 216064 (+ 15360 static: 231424 of 232448)
static_assert(XROW % 16 == 0 && HROW % 16 == 0 && OFF_B % 128 == 0, "bulk-copy alignment");

struct MlParams {
  const __nv_bfloat16* x;    // [M, 2048]
  const int* topk_ids;       // [M, TK] int32, rank order, distinct per token (moe_ml_shared: id 256 last)
  const float* topk_w;       // [M, TK] fp32
  const uint8_t* w13;        // [E(+1), 1024, 2048] e4m3
  const float* w13_scale;    // [E, 8, 16]
  const uint8_t* w2;         // [E(+1), 2048, 512] e4m3
  const float* w2_scale;     // [E, 16, 4]
  __nv_bfloat16* hbuf;       // [M * TK, 512] BF16 h, slot order: scratch
  __nv_bfloat16* y;          // [M * TK, 2048] per-route contributions, rank order (row t * TK + k)
  __nv_bfloat16* out;        // [M, 2048]
  unsigned* bar;             // workspace: word 0 arrival count, word 32 generation (zeroed once)
  uint8_t* hq;               // ML_SEPARATE_AQ builds only: [M * 8, 512] e4m3, slot order
  float* hs;                 // [M * 8, 4]
  int M;
  int _pad;
  const uint8_t* sw13;       // moe_ml_shared: the shared expert (expert 256): [1024, 2048] e4m3
  const float* sw13_scale;   // [8, 16]
  const uint8_t* sw2;        // [2048, 512] e4m3
  const float* sw2_scale;    // [16, 4]
#ifdef ML_FOLD
  const __nv_bfloat16* w_router;  // moe_ml_fold: [256, 2048] the router
  const __nv_bfloat16* w_gate;    // [2048] the shared-expert gate row
  __nv_bfloat16* logits;          // [M, 256] scratch
#endif
};

extern "C" __device__ unsigned int netra_params_layout[] = {
    sizeof(MlParams), offsetof(MlParams, x), offsetof(MlParams, topk_ids), offsetof(MlParams, topk_w),
    offsetof(MlParams, w13), offsetof(MlParams, w13_scale), offsetof(MlParams, w2), offsetof(MlParams, w2_scale),
    offsetof(MlParams, hbuf), offsetof(MlParams, y), offsetof(MlParams, out), offsetof(MlParams, bar),
    offsetof(MlParams, hq), offsetof(MlParams, hs), offsetof(MlParams, M), offsetof(MlParams, sw13),
    offsetof(MlParams, sw13_scale), offsetof(MlParams, sw2), offsetof(MlParams, sw2_scale)
#ifdef ML_FOLD
    , offsetof(MlParams, w_router), offsetof(MlParams, w_gate), offsetof(MlParams, logits)
#endif
};

#define ML_CNT_WORD 256               // the per-chunk counters: workspace words [256, 256 + MAX_GCHUNKS)

// (Variants tried against this layout and removed, with their records: results/sm90/NOTES.md, moe_layer_stream.cu;
// results/sm90/moe_runs/run18_ring and run19_end.)
#define ML_DN_ROT_MIN_M 32

namespace {

// ML_XST: the ring slot of down item k (local, after ng gate_up items) and its use of that slot; the slot's pair is sl % 4
__device__ __forceinline__ void dn_slot(int k, int ng, bool xst, int& sl, int& use) {
  if (!xst) {  // base: item j = ng + k in slot j % 4
    sl = (ng + k) % ML_STAGES;
    use = (ng + k) / ML_STAGES;
    return;
  }
  if (k < 6) {
    sl = k;
    use = sl < ML_STAGES ? (ng > sl ? (ng - 1 - sl) / ML_STAGES + 1 : 0) + k / 6 : k / 6;
    return;
  }
  sl = (k - 6) % ML_STAGES;  // ML_XST 2 after the transition: slots 0-3 again, each past its first down use
  use = (ng > sl ? (ng - 1 - sl) / ML_STAGES + 1 : 0) + 1 + (k - 6) / ML_STAGES;
}

__device__ __forceinline__ void consumer_sync() {
  asm volatile("bar.sync 1, %0;\n" ::"n"(ML_NCW * 32) : "memory");
}
// Generic-proxy global writes of other CTAs (ordered before by a grid barrier) -> this thread's bulk copies.
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }

// n BF16 rows of G x 128 values (row stride `stride`), quantized in place into E4M3 by all consumer warps (moe_align's
// x / st8's h quantization: one scale per 128-group, IEEE divisions): group q's 128 bytes land on bytes
// [128 q, 128 q + 128) of its row, which overlap only the row's own inputs. A round takes whole rows, four
// (row, group) tasks per warp with their steps interleaved; every task of a round is read (consumer barrier)
// before any is written, so no write reaches an input that is still to be read.
template <int G>
__device__ __forceinline__ void quant_rows_inplace(uint8_t* rows, int n, int stride, float* scales, int wid, int lane) {
  constexpr int RPR = (4 * ML_NCW) / G;  // whole rows per round (tasks u >= RPR * G idle)
#pragma unroll 1
  for (int r0 = 0; r0 < n; r0 += RPR) {
    uint2 raw[4];
    float amax[4];
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const int u = v * ML_NCW + wid, row = r0 + u / G, grp = u % G;
      raw[v] = row < n && u < RPR * G ? *reinterpret_cast<const uint2*>(rows + row * stride + grp * 256 + lane * 8) : make_uint2(0u, 0u);
      const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&raw[v]);
      const float2 a = __bfloat1622float2(h2[0]), b = __bfloat1622float2(h2[1]);
      amax[v] = fmaxf(fmaxf(fabsf(a.x), fabsf(a.y)), fmaxf(fabsf(b.x), fabsf(b.y)));
    }
    consumer_sync();  // the round's inputs are read everywhere before any output is written
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
      for (int v = 0; v < 4; ++v) amax[v] = fmaxf(amax[v], __shfl_xor_sync(0xffffffffu, amax[v], o));
#pragma unroll
    for (int v = 0; v < 4; ++v) {  // moe::quant_group_warp's arithmetic, four groups at once
      const int u = v * ML_NCW + wid, row = r0 + u / G, grp = u % G;
      if (row < n && u < RPR * G) {
        const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&raw[v]);
        const float2 a = __bfloat1622float2(h2[0]), b = __bfloat1622float2(h2[1]);
        const float sc = moe::group_scale(amax[v]);
        *reinterpret_cast<uint32_t*>(rows + row * stride + grp * 128 + lane * 4) = moe::quant4(a.x, a.y, b.x, b.y, sc);
        if (lane == 0) scales[row * G + grp] = sc;
      }
    }
  }
}

// Expert e's weights and scales (e == SHARED_E: the shared expert's, moe_ml_shared)
__device__ __forceinline__ const uint8_t* w13_of(const MlParams& p, int e) {
  return e < SHARED_E ? p.w13 + (size_t)e * 1024 * HID : p.sw13;
}
__device__ __forceinline__ const uint8_t* w2_of(const MlParams& p, int e) {
  return e < SHARED_E ? p.w2 + (size_t)e * HID * INTER : p.sw2;
}
__device__ __forceinline__ const float* w13s_of(const MlParams& p, int e) {
  return e < SHARED_E ? p.w13_scale + (size_t)e * 128 : p.sw13_scale;
}
__device__ __forceinline__ const float* w2s_of(const MlParams& p, int e) {
  return e < SHARED_E ? p.w2_scale + (size_t)e * 64 : p.sw2_scale;
}

struct Meta {  // shared-memory route metadata (every CTA builds the same); sized for moe_ml_shared (257 experts)
  unsigned tm[257][4];                 // token bit mask per expert
  int slot_start[258];                 // slot -> first position in the expert-major route list
  short slot_expert[257];
  int gchunk[MAX_GCHUNKS];             // gate_up (= down) chunk -> slot | chunk-in-slot << 16
  short prt[MAX_ROUTES];               // route-list position -> route (t * TK + k)
  float pw[MAX_ROUTES];                // route-list position -> routing weight
  unsigned char slot_of[256];          // routed experts only (the shared slot is the last)
  int nslots, ngc, ndc;
  int pre_items;                       // weight items issued by the owner thread (ring slots 0 ..)
};

// A gate_up chunk's x rows (BF16) into a B buffer: the tokens of expert e with ranks [skip, skip + n) in its token mask
__device__ __forceinline__ void issue_x_rows(const MlParams& p, const Meta& m, int e, int skip, int n, uint8_t* dst, uint64_t* bar) {
  int rank = 0, i = 0;
  for (int w = 0; w < 4 && i < n; ++w) {
    unsigned bits = m.tm[e][w];
    while (bits != 0u && i < n) {
      const int tk = w * 32 + __ffs(bits) - 1;
      bits &= bits - 1u;
      if (rank++ >= skip) bulk_g2s(dst + (i++) * XROW, p.x + (size_t)tk * HID, HID * 2, bar);
    }
  }
}

__device__ __forceinline__ void chunk_of(const Meta& m, int entry, int csize, int& slot, int& p0, int& n, int& e) {
  slot = entry & 0xffff;
  const int cis = entry >> 16;
  p0 = m.slot_start[slot] + cis * csize;
  n = min(csize, m.slot_start[slot + 1] - p0);
  e = m.slot_expert[slot];
}

// This CTA's items of gate_up chunk gci are done (their h stores ordered before by a CTA barrier): add their
// number to the chunk's counter (release). A down chunk's B producer waits for GU_PER_CHUNK.
__device__ __forceinline__ void publish_chunk(const MlParams& p, int gci, int gb, int ge) {
  const int lo = max(gb, gci * GU_PER_CHUNK), hi = min(ge, (gci + 1) * GU_PER_CHUNK);
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;\n" ::"l"(p.bar + ML_CNT_WORD + gci), "r"((unsigned)(hi - lo))
               : "memory");
}

// ML_REL_ATOM: the last grid barrier as one release atomic (its return value gives the target) and acquire polls
__device__ __forceinline__ void grid_arrive_wait_rel(unsigned* count, unsigned ctas) {
  unsigned prev;
  asm volatile("atom.add.release.gpu.global.u32 %0, [%1], 1;\n" : "=r"(prev) : "l"(count) : "memory");
  const unsigned target = prev - (prev & (ctas - 1u)) + ctas;
  unsigned polls = 0;
  while ((int)(ld_acquire_gpu(count) - target) < 0) {
    if (++polls == (1u << 26)) __trap();  // a broken count: fail the launch instead of hanging
  }
}

// The CTA's b-th gate_up chunk (ML_GU_REVERSE: from the last of its range to the first).
__device__ __forceinline__ int gu_chunk(int gc0, int nbg, int b) { return gc0 + b; }

__device__ __forceinline__ void split(int n_items, int c, int& lo, int& hi) {
  lo = (int)(((long long)n_items * c) / ML_CTAS);
  hi = (int)(((long long)n_items * (c + 1)) / ML_CTAS);
}

#ifdef ML_FOLD
// moe_ml_fold: the block's routing folded into the layer's prologue (moe_route's arithmetic, byte for byte the same
// logits, top-8 and gate; no second launch, no transition between two kernels). Units of work, 16 ceil(M/8) + ceil(M/8):
// unit u < 16 G (G = ceil(M/8)): the BF16 logits of tokens [8 (u / 16), +8) for experts [16 (u % 16), +16) (moe_route's
// logit CTA: 8 consumer warps split K, partial sums added in warp order in shared memory, rounded once); the last of a
// group's 16 units (per-group counter, reset by that CTA) selects the group's top-8, a warp per token; unit 16 G + q:
// the shared gate of tokens [8 q, +8) as route 8. CTA c runs units c, c + 128, ...; each finished group (top-8) and
// each gate unit adds 1 to the done count (release); every CTA waits for 2 G (acquire) before reading the routes.
// Workspace words: [ML_FOLD_GRP, +16) the group counters, ML_FOLD_DONE the done count (zeroed after the last barrier).
#define ML_FOLD_GRP 704
#define ML_FOLD_DONE 736

__device__ __forceinline__ void fold_mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                              uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void fold_load16(const __nv_bfloat16* row, int col, uint32_t (&w)[8], bool cg) {
  uint4 v0 = make_uint4(0u, 0u, 0u, 0u), v1 = v0;
  if (row != nullptr) {
    const uint4* q = reinterpret_cast<const uint4*>(row + col);
    v0 = cg ? __ldcg(q) : __ldg(q);
    v1 = cg ? __ldcg(q + 1) : __ldg(q + 1);
  }
  w[0] = v0.x; w[1] = v0.y; w[2] = v0.z; w[3] = v0.w;
  w[4] = v1.x; w[5] = v1.y; w[6] = v1.z; w[7] = v1.w;
}

// moe_route's topk_token (one warp, one token)
__device__ void fold_topk_token(const MlParams& p, int t) {
  const int lane = threadIdx.x & 31;
  int* ids = const_cast<int*>(p.topk_ids);
  float* tw = const_cast<float*>(p.topk_w);
  float v[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = __bfloat162float(__ldcg(p.logits + (size_t)t * 256 + lane + 32 * j));
  float sel_v[TOPK];
  int sel_i[TOPK];
#pragma unroll
  for (int k = 0; k < TOPK; ++k) {
    float bv = -INFINITY;
    int bi = 0x7fffffff;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int idx = lane + 32 * j;
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
      if (lane + 32 * j == bi) v[j] = -INFINITY;
  }
  if (lane == 0) {
    float e[TOPK], s = 0.0f;
#pragma unroll
    for (int k = 0; k < TOPK; ++k) { e[k] = expf(sel_v[k] - sel_v[0]); s += e[k]; }
#pragma unroll
    for (int k = 0; k < TOPK; ++k) {
      ids[t * (TOPK + 1) + k] = sel_i[k];
      tw[t * (TOPK + 1) + k] = e[k] / s;
    }
  }
}

// A fragments of unit u (rows g and g + 8; this warp's 4 blocks of 64 columns, lane t's 16 columns of each)
__device__ __forceinline__ void fold_load_w(const MlParams& p, int u, int nlog, uint32_t (&wa)[4][8], uint32_t (&wb)[4][8]) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int j = u < nlog ? u % 16 : 16;
  const __nv_bfloat16* r0 = j < 16 ? p.w_router + (size_t)(16 * j + g) * HID : (g == 0 ? p.w_gate : nullptr);
  const __nv_bfloat16* r1 = j < 16 ? p.w_router + (size_t)(16 * j + g + 8) * HID : nullptr;
#pragma unroll
  for (int blk = 0; blk < 4; ++blk) {
    const int col = 256 * wid + 64 * blk + 16 * t;
    fold_load16(r0, col, wa[blk], false);
    fold_load16(r1, col, wb[blk], false);
  }
}

// The routing of all M tokens into topk_ids / topk_w [M, 9]; every thread of the CTA enters (the producer warps only
// take part in the CTA barriers). Ends with the done count complete (acquire by thread 0, then a CTA barrier).
__device__ __forceinline__ void fold_route(const MlParams& p, uint8_t* scratch) {
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5, g = lane >> 2, t = lane & 3;
  const bool cons = tid < 256;
  const int M = p.M, G = (M + 7) / 8, nlog = 16 * G, nu = nlog + G;
  float* red = reinterpret_cast<float*>(scratch);           // [8 warps][32 lanes][4]
  int* last = reinterpret_cast<int*>(scratch + 4096);
  uint32_t wa[4][8], wb[4][8];
  if (cons && (int)blockIdx.x < nu) fold_load_w(p, blockIdx.x, nlog, wa, wb);  // constant: before the wait
  pdl_wait();
  pdl_trigger();
#pragma unroll 1
  for (int u = blockIdx.x; u < nu; u += ML_CTAS) {
    if (cons && u != (int)blockIdx.x) fold_load_w(p, u, nlog, wa, wb);
    const int j = u < nlog ? u % 16 : 16, grp = u < nlog ? u / 16 : u - nlog, t0 = 8 * grp;
    if (cons) {
      const int tok = t0 + g;
      const __nv_bfloat16* xr = tok < M ? p.x + (size_t)tok * HID : nullptr;
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int blk = 0; blk < 4; ++blk) {
        uint32_t xb[8];
        fold_load16(xr, 256 * wid + 64 * blk + 16 * t, xb, true);
#pragma unroll
        for (int s = 0; s < 4; ++s)
          fold_mma_bf16(acc, wa[blk][2 * s], wb[blk][2 * s], wa[blk][2 * s + 1], wb[blk][2 * s + 1], xb[2 * s],
                        xb[2 * s + 1]);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) red[(wid * 32 + lane) * 4 + i] = acc[i];
    }
    __syncthreads();
    if (tid < 64) {  // thread -> (fragment lane, row half): the 8 warps' partial sums in warp order, rounded once
      const int fl = (tid >> 1) & 31, h = tid & 1, row = (fl >> 2) + 8 * h;
      if (j < 16 || row == 0) {
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          float sum = 0.0f;
#pragma unroll
          for (int w = 0; w < 8; ++w) sum += red[(w * 32 + fl) * 4 + 2 * h + q];
          const int tok = t0 + 2 * (fl & 3) + q;
          if (tok < M) {
            if (j < 16) {
              p.logits[(size_t)tok * 256 + 16 * j + row] = __float2bfloat16_rn(sum);
            } else {
              const float l = __bfloat162float(__float2bfloat16_rn(sum));
              const_cast<int*>(p.topk_ids)[tok * (TOPK + 1) + TOPK] = SHARED_E;
              const_cast<float*>(p.topk_w)[tok * (TOPK + 1) + TOPK] = 1.0f / (1.0f + expf(-l));
            }
          }
        }
      }
    }
    bool signal = j == 16;
    if (j < 16) {
      __threadfence();
      __syncthreads();
      if (tid == 0) *last = atomicAdd(p.bar + ML_FOLD_GRP + grp, 1u) == 15u;
      __syncthreads();
      if (*last) {
        __threadfence();
        if (cons) for (int tt = wid; tt < 8 && t0 + tt < M; tt += 8) fold_topk_token(p, t0 + tt);
        if (tid == 0) p.bar[ML_FOLD_GRP + grp] = 0u;
        signal = true;
      }
    }
    __syncthreads();  // this unit's route stores (and red reads) are done
    if (tid == 0 && signal) {
      __threadfence();
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(p.bar + ML_FOLD_DONE) : "memory");
    }
  }
  if (tid == 0) {
    unsigned polls = 0;
    while (ld_acquire_gpu(p.bar + ML_FOLD_DONE) < (unsigned)(2 * G)) {
      if (++polls == (1u << 26)) __trap();  // a count that cannot complete: fail instead of hanging
    }
  }
  __syncthreads();
}
#endif

}  // namespace

template <int TK>
__device__ __forceinline__ void ml_body(const MlParams& p) {
  extern __shared__ __align__(1024) uint8_t smem[];
  __shared__ Meta m;
  uint8_t* ring = smem + OFF_RING;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + OFF_BAR);
  uint64_t* empty = full + ML_SLOTS_DN;
  uint64_t* bfull = empty + ML_SLOTS_DN;
  uint64_t* bempty = bfull + 2;
  uint64_t* gridok = bempty + 2;
  uint64_t* bstart = gridok + 1;
  uint64_t* xfree = bstart + 1;  // [2]: x buffer b free (every warp past the last gate_up chunk in it)
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const int c = blockIdx.x;
  const int M = p.M, R = M * TK;
  constexpr int NE = TK > TOPK ? SHARED_E + 1 : SHARED_E;  // experts (moe_ml_shared: + the shared expert)

  if (tid == 0) {
    if (gridDim.x != ML_CTAS || blockDim.x != ML_THREADS || M < 1 || M > ML_MAXM) __trap();
    for (int s = 0; s < ML_SLOTS_DN; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 2);  // both warps of the stage's pair
    }
    mbar_init(&xfree[0], ML_NCW);
    mbar_init(&xfree[1], ML_NCW);
    for (int s = 0; s < 2; ++s) {
      mbar_init(&bfull[s], 1);
      mbar_init(&bempty[s], ML_NCW);
    }
    mbar_init(gridok, 1);
    mbar_init(bstart, 1);
    mbar_fence_init();
  }
#ifdef ML_FOLD
  fold_route(p, smem + OFF_XCH);  // the routes of all tokens, complete and visible (its own PDL wait / trigger)
#define ML_LD_ROUTE __ldcg     // written in this launch: through L2, not the non-coherent path
#else
  pdl_wait();
  pdl_trigger();
#define ML_LD_ROUTE __ldg
#endif
  // the routes: ids and weights into registers (up to 6 per thread; ML_EARLY_GO: the consumer threads only, 4)
  constexpr int NRT = ML_EARLY_GO ? ML_NCW * 32 : ML_THREADS;
  constexpr int RPT = (ML_MAXM * TK + NRT - 1) / NRT;
  int rid[RPT];
  float rw[RPT];
#pragma unroll
  for (int u = 0; u < RPT; ++u) {
    const int r = tid + NRT * u;
    rid[u] = r < R && (tid < NRT) ? ML_LD_ROUTE(p.topk_ids + r) : -1;
    rw[u] = r < R && (tid < NRT) ? ML_LD_ROUTE(p.topk_w + r) : 0.0f;
  }
  for (int i = tid; i < NE * 4; i += ML_THREADS) (&m.tm[0][0])[i] = 0u;
  __syncthreads();
#pragma unroll
  for (int u = 0; u < RPT; ++u) {
    const int r = tid + NRT * u;
    if (r < R && (tid < NRT)) {
      // the contract: ids in [0, 256), distinct per token; moe_ml_shared: rank 8 is the shared expert (256)
      if ((unsigned)rid[u] >= (unsigned)NE || (TK > TOPK && (rid[u] == SHARED_E) != (r % TK == TOPK))) __trap();
      const int t = r / TK;
      atomicOr(&m.tm[rid[u]][t >> 5], 1u << (t & 31));
    }
  }
  __syncthreads();
  if (wid < 8) {  // the same tables, one expert per thread (256 consumer threads): three block-wide exclusive scans
    int* wsum = reinterpret_cast<int*>(smem + OFF_XCH);  // [8][3] warp totals (the exchange area is not in use yet)
    const int e = tid;
    const uint4 w = *reinterpret_cast<const uint4*>(m.tm[e]);
    const int k = __popc(w.x) + __popc(w.y) + __popc(w.z) + __popc(w.w), nz = k > 0, ch = (k + GCH - 1) / GCH;
    int is = nz, it = k, ig = ch;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int a = __shfl_up_sync(0xffffffffu, is, o), b = __shfl_up_sync(0xffffffffu, it, o);
      const int cg = __shfl_up_sync(0xffffffffu, ig, o);
      if (lane >= o) {
        is += a;
        it += b;
        ig += cg;
      }
    }
    if (lane == 31) {
      wsum[wid * 3] = is;
      wsum[wid * 3 + 1] = it;
      wsum[wid * 3 + 2] = ig;
    }
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
    int sl = is - nz, pos = it - k, gc = ig - ch;
    for (int v = 0; v < wid; ++v) {
      sl += wsum[v * 3];
      pos += wsum[v * 3 + 1];
      gc += wsum[v * 3 + 2];
    }
    // moe_ml_shared: the shared expert is one more slot after the routed ones (all M tokens, chunks [tot, tot + chs))
    const int chs = TK > TOPK ? (M + GCH - 1) / GCH : 0;
    {
      int tot = 0;  // the routed chunk count (m.ngc below: + chs)
      for (int v = 0; v < 8; ++v) tot += wsum[v * 3 + 2];
      const long long NGI = (long long)(tot + chs) * GU_PER_CHUNK;
      const int gb0 = (int)(NGI * c / ML_CTAS), ge0 = (int)(NGI * (c + 1) / ML_CTAS), gc00 = gb0 / GU_PER_CHUNK;
      // the owner of the CTA's first gate_up item (expert ee, its k_e tokens, chunks [g0, g0 + ch_e)): the x rows first
      // in this SM's copy queue (B buffer 0, as the B producer's chunk 0), then up to ML_PRE_ITEMS weight items
      auto own = [&](int ee, int ke, int g0, int che) {
        const int cis = gc00 - g0, n = min(GCH, ke - cis * GCH);
        uint8_t* dst = smem + OFF_B;
        mbar_expect_tx(&bfull[0], n * HID * 2 + 512);
        bulk_g2s(dst + B_WS, w13s_of(p, ee), 512, &bfull[0]);
        issue_x_rows(p, m, ee, cis * GCH, n, dst, &bfull[0]);
        const uint8_t* base = w13_of(p, ee);
        int np = 0;
        for (; np < ML_PRE_ITEMS && np < ge0 - gb0 && (gb0 + np) / GU_PER_CHUNK < g0 + che; ++np) {
          const int col8 = (gb0 + np) % GU_PER_CHUNK;  // item gb0 + np -> ring slot np (first use)
          uint8_t* wd = smem + OFF_RING + np * STAGE_BYTES;
          mbar_expect_tx(&full[np], STAGE_BYTES);
          bulk_g2s(wd, base + (size_t)(8 * col8) * HID, HALF_BYTES, &full[np]);
          bulk_g2s(wd + HALF_BYTES, base + (size_t)(512 + 8 * col8) * HID, HALF_BYTES, &full[np]);
        }
        m.pre_items = np;
      };
      if (M >= ML_OWNER_MAX_M) {
        if (tid == 0) m.pre_items = -1;  // not this time: the producers start as without ML_OWNER_GO
      } else if (k > 0 && gc <= gc00 && gc00 < gc + ch) {  // expert e holds the CTA's first gate_up item
        own(e, k, gc, ch);
      } else if (TK > TOPK && e == 255 && gc00 >= tot) {  // the shared expert does
        own(SHARED_E, M, tot, chs);
      }
    }
    if (k > 0) {
      m.slot_of[e] = (unsigned char)sl;
      m.slot_expert[sl] = (short)e;
      m.slot_start[sl] = pos;
      for (int u = 0; u < ch; ++u) m.gchunk[gc + u] = sl | (u << 16);
    }
    if (e == 255) {
      int ns = sl + nz, pe = pos + k, nc = gc + ch;
      if (TK > TOPK) {  // the shared expert's slot: positions [8 M, 9 M), chunks [nc, nc + chs)
        m.slot_expert[ns] = (short)SHARED_E;
        m.slot_start[ns] = pe;
        for (int u = 0; u < chs; ++u) m.gchunk[nc + u] = ns | (u << 16);
        ns += 1;
        pe += M;
        nc += chs;
      }
      m.nslots = ns;
      m.slot_start[ns] = pe;
      m.ngc = nc;
      m.ndc = nc;
    }
  }
  __syncthreads();
  if (wid < ML_NCW) {
#pragma unroll
  for (int u = 0; u < RPT; ++u) {  // route r of token t to expert e -> position slot_start + (# tokens < t on e)
    const int r = tid + NRT * u;
    if (r < R && (tid < NRT)) {
      const int e = rid[u], t = r / TK;
      int before = __popc(m.tm[e][t >> 5] & ((1u << (t & 31)) - 1u));
      for (int w = 0; w < (t >> 5); ++w) before += __popc(m.tm[e][w]);
      const int q = (e < SHARED_E ? m.slot_start[m.slot_of[e]] : M * TOPK) + before;  // the shared slot follows the routed
      m.prt[q] = (short)r;
      m.pw[q] = rw[u];
    }
  }
  }
  if (wid < ML_NCW) consumer_sync();  // prt / pw (read in the down epilogues); the producers are already going

  int gb, ge, db, de;
  split(m.ngc * GU_PER_CHUNK, c, gb, ge);
  split(m.ndc * DN_PER_CHUNK, c, db, de);
  const int ng = ge - gb, nd = de - db;                             // this CTA's items (ng, nd >= 4)
  const int gc0 = gb / GU_PER_CHUNK, nbg = (ge - 1) / GU_PER_CHUNK - gc0 + 1;
  const int dc0 = db / DN_PER_CHUNK, nbd = (de - 1) / DN_PER_CHUNK - dc0 + 1;
  const int drot = (M >= ML_DN_ROT_MIN_M && nbd > 1 && db % DN_PER_CHUNK != 0) ? 1 : 0;
  const int cb = drot ? (dc0 + 1) * DN_PER_CHUNK : db, nfirst = de - cb;
#define ML_DN_CHUNK(k) (dc0 + ((k) + drot) % nbd)                              // the CTA's k-th down chunk
#define ML_DN_ITEM(u) ((u) < nfirst ? cb + (u) : db + ((u) - nfirst))          // its u-th down item
#define ML_DN_LOCAL(i) ((i) >= cb ? (i) - cb : nfirst + ((i) - db))            // item i's place in that order

  if (wid == ML_NCW) {  // ------------------------------------------------ weight producer
    if (lane == 0) {
      const uint64_t pol_last = l2_evict_last(), pol_first = l2_evict_first();
      const int j0 = max(m.pre_items, 0);  // the owner thread issued x, then items [0, j0) (-1: no owner this time)
      if (m.pre_items < 0) mbar_wait(bstart, 0);
      for (int j = j0; j < ng + nd; ++j) {
        const int s = j % ML_STAGES;
        // gate_up item j: slot j % 4, its use j / 4; down item k = j - ng: dn_slot
        int sl = s, use = j / ML_STAGES;
        if (j >= ng) dn_slot(j - ng, ng, M < ML_XST_MAX_M, sl, use);
        if (use >= 1) {
          mbar_wait(&empty[sl], (use - 1) & 1);
        } else if (sl >= ML_STAGES && nbg > sl - ML_STAGES) {
          mbar_wait(&xfree[sl - ML_STAGES], 0);  // the x buffer's last gate_up chunk is done
        }
        uint8_t* dst = sl < ML_STAGES ? ring + sl * STAGE_BYTES : smem + OFF_B + (sl - ML_STAGES) * BBUF;
#define s sl
        mbar_expect_tx(&full[s], STAGE_BYTES);
        {
          const int i = j < ng ? gb + j : ML_DN_ITEM(j - ng);
          const int sl2 = (j < ng ? m.gchunk[i / GU_PER_CHUNK] : m.gchunk[i / DN_PER_CHUNK]) & 0xffff;
          const bool multi = m.slot_start[sl2 + 1] - m.slot_start[sl2] > GCH;  // the expert streams twice or more
          const uint64_t pol = multi ? pol_last : pol_first;
          if (multi || ML_L2HINT >= 2) {
            const int e = m.slot_expert[sl2];
            if (j < ng) {
              const int col8 = i % GU_PER_CHUNK;
              const uint8_t* base = w13_of(p, e);
              bulk_g2s_hint(dst, base + (size_t)(8 * col8) * HID, HALF_BYTES, &full[s], pol);
              bulk_g2s_hint(dst + HALF_BYTES, base + (size_t)(512 + 8 * col8) * HID, HALF_BYTES, &full[s], pol);
            } else {
              bulk_g2s_hint(dst, w2_of(p, e) + (size_t)(i % DN_PER_CHUNK) * 64 * INTER, STAGE_BYTES, &full[s], pol);
            }
            continue;
          }
        }
        if (j < ng) {
          const int i = gb + j, col8 = i % GU_PER_CHUNK;
          const int e = m.slot_expert[m.gchunk[i / GU_PER_CHUNK] & 0xffff];
          const uint8_t* base = w13_of(p, e);
          bulk_g2s(dst, base + (size_t)(8 * col8) * HID, HALF_BYTES, &full[s]);
          bulk_g2s(dst + HALF_BYTES, base + (size_t)(512 + 8 * col8) * HID, HALF_BYTES, &full[s]);
        } else {
          const int i = ML_DN_ITEM(j - ng), r64 = i % DN_PER_CHUNK;
          const int e = m.slot_expert[m.gchunk[i / DN_PER_CHUNK] & 0xffff];
          bulk_g2s(dst, w2_of(p, e) + (size_t)r64 * 64 * INTER, STAGE_BYTES, &full[s]);
        }
#undef s
      }
    }
    return;
  }
  if (wid == ML_NCW + 1) {  // ------------------------------------------------ B producer
    if (lane == 0) {
      for (int b = m.pre_items >= 0 ? 1 : 0; b < nbg + nbd; ++b) {  // chunk 0 from the owner thread (unless pre_items < 0)
        const int s = b & 1;
        if (b >= 2) mbar_wait(&bempty[s], ((b >> 1) - 1) & 1);
        if (b >= nbg) {  // the chunk's h rows: every item of the gate_up chunk with the same index has published
          const unsigned* cnt = p.bar + ML_CNT_WORD + ML_DN_CHUNK(b - nbg);
          unsigned polls = 0;
          while (ld_acquire_gpu(cnt) < GU_PER_CHUNK) {
            __nanosleep(64);
            if (++polls == (1u << 24)) __trap();  // a count that cannot complete: fail instead of hanging
          }
          fence_proxy_async_global();
        }
        uint8_t* dst = b < nbg ? smem + OFF_B + s * BBUF : smem + OFF_XCH + (((b - nbg) & 1) ^ 1) * HBUF;
        int slot, p0, n, e;
        if (b < nbg) {
          chunk_of(m, m.gchunk[gu_chunk(gc0, nbg, b)], GCH, slot, p0, n, e);
          mbar_expect_tx(&bfull[s], n * HID * 2 + 512);
          bulk_g2s(dst + B_WS, w13s_of(p, e), 512, &bfull[s]);
          {  // the chunk's tokens (set bits of the expert's token mask, ranks [cis * GCH, + n)): x rows, BF16
            issue_x_rows(p, m, e, (m.gchunk[gu_chunk(gc0, nbg, b)] >> 16) * GCH, n, dst, &bfull[s]);
          }
          if (b == 0) mbar_arrive(bstart);
        } else {
          chunk_of(m, m.gchunk[ML_DN_CHUNK(b - nbg)], DCH, slot, p0, n, e);
          mbar_expect_tx(&bfull[s], n * INTER * 2 + 256);
          bulk_g2s(dst + B_WS2, w2s_of(p, e), 256, &bfull[s]);
          for (int i = 0; i < n; ++i)  // the chunk's h rows, BF16 (slot order: contiguous)
            bulk_g2s(dst + i * HROW, p.hbuf + (size_t)(p0 + i) * INTER, INTER * 2, &bfull[s]);
        }
      }
    }
    return;
  }

  // ------------------------------------------------------------------ consumers (warps 0 .. ML_NCW-1)
  const int g = lane >> 2, t = lane & 3;
  // phase 2: gate_up. Per chunk (an expert's <= 8 tokens): its x rows arrive in BF16; consumer warp w quantizes
  // row w in place (moe_align's x quantization, group by group in increasing order: group q's 128 E4M3 bytes
  // land on bytes [128 q, 128 q + 128) of the row, which only groups <= q / 2 occupied); then the chunk's items.
  // Local item j = i - gb goes to stage j % ML_STAGES and to its warp pair (sw, half: ML_PAIR_XS). The pair splits
  // the 16 K blocks with the numerics of one warp: warp sw runs the scaled accumulation chain over K blocks 0-7;
  // warp sw + ML_STAGES runs the MMAs of K blocks 8-15 (the expensive part: FP8 unpacking + HMMA) at the same
  // time, keeps their raw fragments, takes sw's partial sums through shared memory and continues the chain in
  // K order (acc = fma(d, scales, acc), as kblock_mma2), then writes h.
  const int sw = wid >> 1, half = wid & 1;
  {  // phases 2 and 3 (the warm-up warp goes straight to phase 4)
    float* xch = reinterpret_cast<float*>(smem + OFF_XCH);
    for (int b = 0; b < nbg; ++b) {
      const int gci = gu_chunk(gc0, nbg, b);
      int slot, p0, n, e;
      chunk_of(m, m.gchunk[gci], GCH, slot, p0, n, e);
      uint8_t* bb = smem + OFF_B + (b & 1) * BBUF;
      float* bxs = reinterpret_cast<float*>(bb + B_XS);
      const float* bws = reinterpret_cast<const float*>(bb + B_WS);
      mbar_wait(&bfull[b & 1], (b >> 1) & 1);
      quant_rows_inplace<16>(bb, n, XROW, bxs, wid, lane);
      consumer_sync();
      if (tid == 0 && b > 0) publish_chunk(p, gu_chunk(gc0, nbg, b - 1), gb, ge);  // every warp is past chunk b - 1's items
      const int lo = max(gb, gci * GU_PER_CHUNK), hi = min(ge, (gci + 1) * GU_PER_CHUNK);
#pragma unroll 1
      for (int i = lo + (((sw - (lo - gb)) % ML_STAGES) + ML_STAGES) % ML_STAGES; i < hi; i += ML_STAGES) {
        const int j = i - gb, col8 = i % GU_PER_CHUNK;
        mbar_wait(&full[sw], (j / ML_STAGES) & 1);
        const uint8_t* tile = ring + sw * STAGE_BYTES + g * HID + t * 32;
        const float* wsg = bws + (col8 >> 4) * 16;
        const float* wsu = bws + (4 + (col8 >> 4)) * 16;
        float* xb = xch + (((j / ML_STAGES) & 1) * ML_STAGES + sw) * 4 * 32;  // [4][lane]
        const bool valid = g < n;
        const uint8_t* xrow = bb + g * XROW + t * 32;
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        if (half == 0) {
#pragma unroll 4
          for (int kb = 0; kb < 8; ++kb) {
            uint32_t bf[8];
            moe::load_b(xrow + kb * 128, valid, bf);
            const float st = valid ? bxs[g * 16 + kb] : 0.0f;
            uint4 a[4];
            moe::load_a(a, tile + kb * 128, HID);
            moe::kblock_mma2(acc, a, bf, wsg[kb], wsu[kb], st, t);
          }
          __syncwarp();
          if (lane == 0) mbar_arrive(&empty[sw]);
#pragma unroll
          for (int z = 0; z < 4; ++z) xb[z * 32 + lane] = acc[z];
          asm volatile("bar.sync %0, 64;\n" ::"r"(2 + sw) : "memory");
          continue;
        }
        float d[8][4], sts[8];
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) {
          const int kb = 8 + kk;
          uint32_t bf[8];
          moe::load_b(xrow + kb * 128, valid, bf);
          sts[kk] = valid ? bxs[g * 16 + kb] : 0.0f;
          uint4 a[4];
          moe::load_a(a, tile + kb * 128, HID);
          moe::kblock_d(d[kk], a, bf);
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[sw]);  // the stage is read: the producer may refill it
        asm volatile("bar.sync %0, 64;\n" ::"r"(2 + sw) : "memory");  // sw's partial sums
#pragma unroll
        for (int z = 0; z < 4; ++z) acc[z] = xb[z * 32 + lane];
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) moe::kblock_acc2(acc, d[kk], wsg[8 + kk], wsu[8 + kk], sts[kk], t);
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {  // acc[h2]: gate (row g), acc[2 + h2]: up, token column 2t + h2
          const int col = 2 * t + h2;
          if (col < n) {
            const float gt = __bfloat162float(__float2bfloat16_rn(acc[h2]));
            const float up = __bfloat162float(__float2bfloat16_rn(acc[2 + h2]));
            p.hbuf[(size_t)(p0 + col) * INTER + 8 * col8 + g] = __float2bfloat16_rn(moe::silu_mul(gt, up));
          }
        }
      }
      // this warp's generic writes to the buffer (the in-place quantization) before the bulk copies that refill it
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      fence_proxy_async_global();  // this thread's h stores, before other CTAs' bulk copies read them
      __syncwarp();
      if (lane == 0) mbar_arrive(&bempty[b & 1]);
      if (lane == 0 && b >= nbg - 2) mbar_arrive(&xfree[b & 1]);  // the buffer's last gate_up chunk
    }

    // phase 3: the last chunk's count (ML_CHUNK_FLAGS) or a grid barrier (h of every route in hbuf; the twin); the B
    // producer then copies each down chunk's h rows
    fence_proxy_async_global();  // this thread's h stores, before other CTAs' bulk copies read them
    consumer_sync();
    if (tid == 0) {
      publish_chunk(p, gu_chunk(gc0, nbg, nbg - 1), gb, ge);
    }

  }

  // phase 4: down items; local item j = ng + (i - db) (ML_DN_ROT: ng + the item's place in the rotated order)
  for (int b = nbg; b < nbg + nbd; ++b) {
    const int dci = ML_DN_CHUNK(b - nbg);
    int slot, p0, n, e;
    chunk_of(m, m.gchunk[dci], DCH, slot, p0, n, e);
    uint8_t* bb = smem + OFF_XCH + (((b - nbg) & 1) ^ 1) * HBUF;
    float* bhs = reinterpret_cast<float*>(bb + B_HS);
    const float* bws = reinterpret_cast<const float*>(bb + B_WS2);
    mbar_wait(&bfull[b & 1], (b >> 1) & 1);
    {
      quant_rows_inplace<4>(bb, n, HROW, bhs, wid, lane);  // the chunk's h rows
      consumer_sync();
    }
    const int lo = max(db, dci * DN_PER_CHUNK), hi = min(de, (dci + 1) * DN_PER_CHUNK);
    const int ntile = (n + 7) >> 3;
#pragma unroll 1
            // use of a slot is consumed by one pair, in order, so a parity wait always targets the barrier's current phase
    for (int i = lo; i < hi; ++i) {
      const int j = ng + ML_DN_LOCAL(i), r64 = i % DN_PER_CHUNK;
      int sl, use;
      dn_slot(j - ng, ng, M < ML_XST_MAX_M, sl, use);
      if (sl % ML_STAGES != sw) continue;
      mbar_wait(&full[sl], use & 1);
      const uint8_t* sbase = sl < ML_STAGES ? ring + sl * STAGE_BYTES : smem + OFF_B + (sl - ML_STAGES) * BBUF;
      // the pair splits the item's 4 row tiles: warp sw rows [0, 32), warp sw + ML_STAGES rows [32, 64)
      const uint8_t* tile = sbase + (half * 32 + g) * INTER + t * 32;
      const float* ws = bws + (r64 >> 1) * 4;
#pragma unroll 1
      for (int nt = 0; nt < ntile; ++nt) {
        const int col = nt * 8 + g;
        const bool valid = col < n;
        const uint8_t* hrow = bb + col * HROW + t * 32;
        float acc[2][4];
#pragma unroll
        for (int q = 0; q < 2; ++q) acc[q][0] = acc[q][1] = acc[q][2] = acc[q][3] = 0.0f;
#pragma unroll
        for (int kb = 0; kb < 4; ++kb) {
          uint32_t bf[8];
          moe::load_b(hrow + kb * 128, valid, bf);
          const float st = valid ? bhs[col * 4 + kb] : 0.0f;
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            uint4 a[4];
            moe::load_a(a, tile + q * 16 * INTER + kb * 128, INTER);
            moe::kblock_mma(acc[q], a, bf, ws[kb], st, t);
          }
        }
        if (nt == ntile - 1) {  // the stage is read: release it before the last tile's stores
          __syncwarp();
          if (lane == 0) mbar_arrive(&empty[sl]);
        }
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {  // token column nt*8 + 2t + h2: acc[q][h2] row q*16 + g, acc[q][2 + h2] row + 8
          const int cc = nt * 8 + 2 * t + h2;
          if (cc < n) {
            const int r = m.prt[p0 + cc];
            const float w = m.pw[p0 + cc];
            __nv_bfloat16* yr = p.y + (size_t)r * HID + r64 * 64 + half * 32 + g;
#pragma unroll
            for (int q = 0; q < 2; ++q) {
              yr[q * 16] = __float2bfloat16_rn(acc[q][h2] * w);
              yr[q * 16 + 8] = __float2bfloat16_rn(acc[q][2 + h2] * w);
            }
          }
        }
      }
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // the in-place h quantization, as above
    __syncwarp();
    if (lane == 0) mbar_arrive(&bempty[b & 1]);
  }

  // phase 5: the last grid barrier (y complete), top-k sum in rank order (FP32), rounded once to BF16
  consumer_sync();
  if (tid == 0) {
    grid_arrive_wait_rel(p.bar + 64, gridDim.x);
  }
  consumer_sync();
  // every down chunk's producer has seen its count (they all precede the last grid barrier): zero them for the next launch
  for (int i = c * ML_NCW * 32 + tid; i < MAX_GCHUNKS; i += ML_CTAS * ML_NCW * 32) p.bar[ML_CNT_WORD + i] = 0u;
#ifdef ML_FOLD
  if (c == 0 && tid == 0) p.bar[ML_FOLD_DONE] = 0u;  // every CTA read it complete before the barrier
#endif
  const int u0 = c * (ML_NCW * 32) + tid, ustep = ML_CTAS * ML_NCW * 32;
#pragma unroll 1
  for (int u = u0; u < M * (HID / 8); u += ustep) {
    const int tk = u / (HID / 8), col = (u % (HID / 8)) * 8;
    uint4 v[TK];
#pragma unroll
    for (int k = 0; k < TK; ++k) v[k] = __ldcg(reinterpret_cast<const uint4*>(p.y + (size_t)(tk * TK + k) * HID + col));
    float s[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) s[i] = 0.0f;
#pragma unroll
    for (int k = 0; k < TK; ++k) {  // rank order, the shared expert last (moe_ml_shared)
      float f[8];
      moe::bf16x8_to_float(v[k], f);
#pragma unroll
      for (int i = 0; i < 8; ++i) s[i] += f[i];
    }
    uint4 o;
    __nv_bfloat162* o2 = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
    for (int i = 0; i < 4; ++i) o2[i] = __floats2bfloat162_rn(s[2 * i], s[2 * i + 1]);
      *reinterpret_cast<uint4*>(p.out + (size_t)tk * HID + col) = o;
  }
}

#ifdef ML_FOLD
extern "C" __global__ void __launch_bounds__(ML_THREADS, 1) moe_ml_fold(const MlParams p) { ml_body<TOPK + 1>(p); }
#else
extern "C" __global__ void __launch_bounds__(ML_THREADS, 1) moe_ml(const MlParams p) { ml_body<TOPK>(p); }
extern "C" __global__ void __launch_bounds__(ML_THREADS, 1) moe_ml_shared(const MlParams p) { ml_body<TOPK + 1>(p); }
#endif
