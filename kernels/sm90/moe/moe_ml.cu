// MoE ml: the whole routed MoE layer for 1..128 tokens in ONE cooperative kernel with a continuous weight
// stream per SM (issue 7: "never slower than SGLang" at 16..128 tokens and the 128-token floor gate).
//
// Why: the st8 sequence (align -> gate_up -> down) at 128 tokens takes ~246 us for a 188 us byte floor:
// align ~7 us, gate_up at ~0.87 of the copy rate, down at ~0.64 (ncu run11: DRAM 60%). Every consumer
// load that waits behind a saturated weight stream costs 1-5 us (moe_ms round 6 timeline), and st8's down
// reads its B operand (the gate|up cache) with consumer loads at every (slot, chunk) group. moe_ms showed
// that a TMA ring fed by one producer warp streams at the copy rate when nothing else waits behind it.
// ml keeps that, and moves EVERY operand through the TMA queue:
//   * weights through a 4 x 32 KB ring (producer warp 8), as moe_ms;
//   * B operands and the expert's weight scales through two 33 KB "B buffers" (producer warp 9), one chunk
//     ahead of the consumers: a gate_up chunk's x rows and a down chunk's h rows arrive in BF16 and the
//     consumers quantize them in place (as moe_align / st8, bitwise), so neither x_q nor h_q makes a round trip
//     through global memory and no grid barrier waits for them.
// Work is split statically in contiguous, expert-major item ranges (a CTA sees ~2-3 experts per GEMM):
//   gate_up item = (slot, 8-token chunk, 8 columns): gate rows [8j, +8) and up rows [512 + 8j, +8) of the
//     expert (32 KB), one 16-row MMA tile whose rows g / g + 8 are gate / up of the same column, so
//     h = bf16(SiLU(bf16 gate) * bf16 up) is computed in the epilogue (as moe_ms) and written to hbuf in
//     slot order (row p = the route's position in the expert-major route list);
//   down item = (slot, 8-token chunk, 64 output rows): w2 rows [64 r, +64) x 512 (32 KB, st8's item).
//   An expert with more than 8 tokens streams its weights once per chunk (round 7: 16 / 64-token chunks made
//   the CTAs holding such an expert the stragglers of the whole grid: 244 vs 215 us at 128 tokens).
// Phases (grid = 128 CTAs, cooperative; 8 consumer warps, a pair per ring stage):
//   0. every CTA: route metadata in shared memory from the top-8 ids (slots = active experts by increasing
//      id, tokens increasing inside a slot, chunk tables); then the B producer copies the first chunk's x rows
//      and only then the weight producer starts; both start as soon as the slot tables exist, while the consumers
//      build the route-list tables (ML_EARLY_GO, round 8);
//   1. gate_up chunks: x rows quantized in place, then the items; after each chunk thread 0 adds the CTA's item
//      count of that chunk to the chunk's counter (workspace, release);
//   2. down chunks: the B producer copies down chunk i's h rows once gate_up chunk i (the same expert and
//      8 tokens) has all 64 items counted - no grid barrier between the GEMMs, so a CTA waits only for the
//      experts it needs, mostly its own (ranges are proportional in both lists); the weight producer streams w2
//      meanwhile; h quantized in place, then the items: y = bf16(acc * w) per route into y [M * 8, 2048] (rank
//      order); grid barrier (y complete; then the counters are zeroed for the next launch) on a count that only grows
//      (ML_MONO_BAR, round 8: no generation read, no reset; run17 -0.8..-1.8 us single launch);
//   3. top-k sum: out[t, 8 columns] = bf16(sum over k in rank order, FP32) by (token, 8-column) units.
// A gate_up item's pair splits the 16 K blocks keeping one warp's numerics: warp sw runs the scaled FP32 chain
// over K blocks 0-7 while warp sw + 4 runs the MMAs of blocks 8-15, then continues the chain in K order.
// Round 9 (run18, results/sm90/moe_runs/run18_ring; A/B in interleaved graph replay, flags below): the pair is warps
// 2s / 2s + 1 (two SM sub-partitions: sm90 runs mma.sync e4m3 as F2FP unpacking + HMMA.16816, ~1.3 us per item on one);
// the slot / chunk tables come from 256 threads; the in-place quantization spreads its tasks over all consumer warps;
// the chunk counts and the last barrier are release atomics; from 32 tokens a CTA runs its own down chunks first.
// Round 10 (run19, results/sm90/moe_runs/run19_end; same A/B): every weight copy carries an L2 policy (evict_first; evict_last
// for an expert with more than 8 tokens, whose weights stream once per 8-token chunk), which keeps x / h / y and the counters
// in L2 under the weight stream (0.97 of the time at 128 tokens); down items 4 and 5 go to two extra ring slots in the freed
// x buffers, so the ring runs 6 deep across the gate_up -> down transition (the first down chunk's h waits for the gate_up
// chunk's other CTAs); below 128 tokens the scan thread that owns the CTA's first gate_up chunk issues its x rows and first
// weight item before the tables are even written.
// A down item's pair splits the 4 row tiles.
// Numerics of the v3 st8 sequence by construction (bitwise): the same x and h quantization, the same
// swapped-operand mma.sync m16n8k32 e4m3 core (moe_common.cuh) with the same K order and per-128-K-block
// FP32 scaling per (row, token) element, gate/up rounded to BF16, y = bf16(acc * w), routes summed in rank
// order in FP32 and rounded once. (An MMA element depends only on its row of A and its column of B.)
// Protocols: ring stage s = local item j % 4 belongs to consumer warps s and s + 4 (full/empty mbarriers,
// empty counts 2 arrivals, parity waits, as moe_ms). B buffer b % 2 holds the CTA's b-th chunk: bfull (1
// arrival + tx bytes), bempty (8 warp arrivals; a warp arrives once per chunk, after waiting for that chunk's
// bfull, so an early arrival can never complete the phase of chunk b - 2; before it, a proxy fence orders the
// warp's in-place writes before the bulk copies that refill the buffer). Before each down chunk the B producer
// polls its gate_up chunk's counter (acquire), then issues a global proxy fence: hbuf is written by other CTAs'
// generic stores and read here by the async proxy. (Round 7g waited on a grid barrier and the gridok mbarrier
// instead: ML_CHUNK_FLAGS=0, still the act+quant twin's build; the counters took 2-6 us off every batch, run16 7i.)
// Code size matters (moe_ms round 6): loops over tasks stay rolled.
// Workspace: word 64 the last grid barrier's count (only grows, 128 per launch; the act+quant twin: words 0 / 32, its
// self-resetting barrier), words 256.. the per-chunk counters (zeroed after the barrier). One stream at a time per device.
// The shared expert
// (a 9th route) is not supported: the host runs the st8 sequence for it.
#include "moe_common.cuh"
#include "moe_sync.cuh"
#include <stddef.h>

#ifndef ML_SEPARATE_AQ
#define ML_SEPARATE_AQ 0              // 1: the act+quant A/B twin (contract moe_ml_aq_e256_k8): gate_up writes the
#endif                                // BF16 gate|up cache, SiLU*up + quantization run as their own grid-wide step, and every
                                      // later default off (round 7's build, run16). 2 (round 11, contract moe_ml_aq2_e256_k8):
                                      // the same step on today's defaults (only the per-chunk counters give way to the grid
                                      // barrier that the step needs, as a separate act+quant kernel would)
#define ML_AQ_OLD (ML_SEPARATE_AQ == 1)
#define HID 2048
#define INTER 512
#define TOPK 8
#define ML_MAXM 128
#define ML_CTAS 128
#ifndef ML_STAGES
#define ML_STAGES 4                   // ring stages (exploration builds: -DML_STAGES=5 with smaller chunks)
#endif
#define ML_NCW (2 * ML_STAGES)        // consumer warps: a pair per ring stage
#ifndef ML_WARM                       // 1 (round 9): one more warp runs the down-item code once, dry, right after the metadata,
#define ML_WARM 0                     // so the SM's instruction cache holds it before the down phase (run18: every CTA's first
#endif                                // down items waited ~4 us for that code under the saturated weight stream)
#define ML_THREADS (32 * (ML_NCW + 2 + (ML_WARM ? 1 : 0)))  // + weight producer + B producer (+ the warm-up warp)
#define ML_WARM_WARP (ML_NCW + 2)
#define STAGE_BYTES 32768
#define HALF_BYTES 16384              // 8 rows x 2048 B
#define MAX_ROUTES (ML_MAXM * TOPK)   // 1024
#ifndef GCH
#define GCH 8                         // tokens per gate_up chunk: one 8-token MMA tile (round 7: 16 = two tiles
                                      // made the CTAs holding an expert with > 8 tokens the stragglers)
#endif                                // (exploration: -DGCH=4 -DDCH=4 frees 32 KB for a 5th ring stage)
#ifndef DCH
#define DCH 8                         // tokens per down chunk (round 7: 8 against 64 / 32, the same stragglers)
#endif
#define MAX_GCHUNKS (256 + MAX_ROUTES / GCH)
#define MAX_DCHUNKS (256 + MAX_ROUTES / DCH)
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
#ifndef ML_XST                        // 1 / 2 (round 10; 2 adopted, run19 g-j): two more ring slots in the down phase, in the x buffers
#define ML_XST (2 * !ML_AQ_OLD)       // (free once the gate_up chunks are done); the down chunks' h rows move to two 8.4 KB
#endif                                // buffers at OFF_XCH (the first one past the gate_up exchange area, which is still in use).
                                      // 1: down item k in slot k % 6 all along (pairs 0 / 1 own two slots each); 2: only down
                                      // items 4 and 5 go to the extra slots (the gate_up -> down transition), then 4 slots again.
                                      // Either only below ML_XST_MAX_M tokens (else base's slots).
#ifndef ML_XST_MAX_M
#define ML_XST_MAX_M 1000
#endif
#ifndef ML_OWNER_GO                   // 1 (round 10, adopted with 1 item below 128 tokens): right after the block-wide scans, the
#define ML_OWNER_GO (!ML_AQ_OLD)      // thread whose expert holds the CTA's first gate_up item issues that chunk's x rows and
#endif                                // scales (B buffer 0), then up to ML_PRE_ITEMS weight items of the same expert, before the
#ifndef ML_PRE_ITEMS                  // tables are written and synchronized; the B producer starts at chunk 1, the weight producer
#define ML_PRE_ITEMS 1                // after those items (no bstart wait: the x rows went first from the same thread; run19 h:
#endif                                // 1 item beat 4)
#ifndef ML_OWNER_MAX_M                // ML_OWNER_GO applies below this many tokens (run19 h: 0.994 at 64 tokens, 1.001 at 128)
#define ML_OWNER_MAX_M 128
#endif
#ifndef ML_PDL                        // 1 (round 11, exploration): launched with programmatic stream serialization: the mbarriers
#define ML_PDL 0                      // are initialised, then every thread executes griddepcontrol.wait before any global read
#endif                                // (the routes and x come from the previous kernel, the counters from the previous launch),
                                      // then launch_dependents
#ifndef ML_L2HINT                     // 1 (round 10; 2 adopted, run19 i-j): an expert with more than 8 tokens streams its weights
#define ML_L2HINT (2 * !ML_AQ_OLD)    // once per 8-token chunk (~5 of 251 experts at 128 tokens: 2% more bytes than the floor);
#endif                                // its weight copies carry an L2 evict_last policy so the second chunk's reads hit L2;
                                      // 2: also evict_first on every other weight copy (read once); 3: evict_first on all
#define HBUF (B_WS2 + 256)            // ML_XST: a down chunk's B buffer (8576)
#if ML_XST
#define ML_SLOTS_DN (ML_STAGES + 2)
#define OFF_BAR (OFF_XCH + 2 * HBUF)                  // 215808
#define ML_SMEM (OFF_BAR + 256)                       // 216064 (+ 15360 static: 231424 of 232448)
#else
#define ML_SLOTS_DN ML_STAGES
#define OFF_BAR (OFF_XCH + 2 * ML_STAGES * 4 * 32 * 4)  // 202752
#define ML_SMEM (OFF_BAR + 128)                       // 202880 (scripts/gpu/stream_probe.py: ml_launch_shape)
#endif
static_assert(XROW % 16 == 0 && HROW % 16 == 0 && OFF_B % 128 == 0, "bulk-copy alignment");

struct MlParams {
  const __nv_bfloat16* x;    // [M, 2048]
  const int* topk_ids;       // [M, 8] int32, rank order, distinct per token
  const float* topk_w;       // [M, 8] fp32
  const uint8_t* w13;        // [E(+1), 1024, 2048] e4m3
  const float* w13_scale;    // [E(+1), 8, 16]
  const uint8_t* w2;         // [E(+1), 2048, 512] e4m3
  const float* w2_scale;     // [E(+1), 16, 4]
  __nv_bfloat16* hbuf;       // [M * 8, 512] BF16 h, slot order: scratch
  __nv_bfloat16* y;          // [M * 8, 2048] per-route contributions, rank order (row t * 8 + k)
  __nv_bfloat16* out;        // [M, 2048]
  unsigned* bar;             // workspace: word 0 arrival count, word 32 generation (zeroed once)
  uint8_t* hq;               // ML_SEPARATE_AQ builds only: [M * 8, 512] e4m3, slot order
  float* hs;                 // [M * 8, 4]
  int M;
  int _pad;
};

extern "C" __device__ unsigned int netra_params_layout[] = {
    sizeof(MlParams), offsetof(MlParams, x), offsetof(MlParams, topk_ids), offsetof(MlParams, topk_w),
    offsetof(MlParams, w13), offsetof(MlParams, w13_scale), offsetof(MlParams, w2), offsetof(MlParams, w2_scale),
    offsetof(MlParams, hbuf), offsetof(MlParams, y), offsetof(MlParams, out), offsetof(MlParams, bar),
    offsetof(MlParams, hq), offsetof(MlParams, hs), offsetof(MlParams, M)};

#ifndef ML_WAIT_XQ
#define ML_WAIT_XQ 0                  // 1 (exploration, rejected in run16 7h: no gain): the weight producer waits for
#endif                                // the first chunk's x quantization (which then sees an idle copy queue)
#ifndef ML_CHUNK_FLAGS                // 1: no grid barrier between the GEMMs: a down chunk waits only for the gate_up
#define ML_CHUNK_FLAGS (!ML_SEPARATE_AQ)  // chunk of the same (expert, 8 tokens) (a per-chunk item counter, workspace)
#endif
#define ML_CNT_WORD 256               // the per-chunk counters: workspace words [256, 256 + MAX_GCHUNKS)
static_assert(!ML_CHUNK_FLAGS || GCH == DCH, "chunk flags pair gate_up chunk i with down chunk i");

#ifndef ML_MONO_BAR                  // 1: the last grid barrier on a count that only grows (workspace word 64; run17:
#define ML_MONO_BAR (!ML_AQ_OLD)      // -0.8..-1.8 us at 8..128 tokens); the act+quant twin keeps moe_sync's grid_arrive_wait
#endif
#ifndef ML_EARLY_GO                   // 1: the producers start right after the slot tables (the B producer takes a chunk's
#define ML_EARLY_GO (!ML_AQ_OLD)      // tokens from the expert's token mask); the consumers build the route-list tables
#endif                                // (prt / pw, read only in the down epilogues) meanwhile (run17: -0.5..-1.5 us)
#ifndef ML_GU_REVERSE                 // 1 (exploration, rejected in run17: no gain, 56.8 vs 56.6 us at 8 tokens, 205.1 vs 205.3 at
#define ML_GU_REVERSE 0               // 128, single launch): every CTA runs its gate_up range backwards (its last chunk first), so
#endif                                // its first down chunk completes with its own gate_up instead of the previous CTA's
#ifndef ML_NOMMA
#define ML_NOMMA 0                    // exploration, timing only (wrong results): no MMA work in the gate_up (bit 0) /
#endif                                // down (bit 1) consumers; 3 = none anywhere (run17's "nomma")
#define ML_NOMMA_GU (ML_NOMMA & 1)
#define ML_NOMMA_DN ((ML_NOMMA >> 1) & 1)
// (round 9 also tried, and removed: warp-0 tables from rolled loops; fragment loads without bank conflicts (odd-g lanes
// swapping their 16-byte halves: 1.005 / 1.015 of the time at 8 / 128 tokens); the weight producer not waiting for the x
// copies (up to 1.011); a spinning count poll (no gain): results/sm90/moe_runs/run18_ring)
// (round 10 also tried, and removed: a down split balancing each CTA's item total, per-(token, 64-row) arrival counters in
// place of the last barrier, one-warp-per-row and one-round quantizations, an exact reciprocal quotient, splits weighted by
// the CTAs' speeds in the previous launch, early weight copies ahead of the x rows: run19_end/README.md; the source with
// those flags is kernels/sm90/moe/rejected/moe_ml_round10_flags.cu.txt)
#ifndef ML_META_PAR                   // 1 (round 9, adopted): the slot / chunk tables from 256 threads (one expert each, block-
#define ML_META_PAR (!ML_AQ_OLD)      // wide scans) instead of warp 0 alone (run18 h: 0.982 / 0.996 of the time at 8 / 128 tokens)
#endif
static_assert(!ML_META_PAR || (GCH == DCH && ML_NCW >= 8), "one table for both GEMMs; 256 consumer threads");
static_assert(!ML_OWNER_GO || (ML_META_PAR && !ML_GU_REVERSE && ML_PRE_ITEMS <= ML_STAGES), "ML_OWNER_GO: the 256-thread tables");
static_assert(!ML_L2HINT || !ML_GU_REVERSE, "ML_L2HINT: forward gate_up order");
#ifndef ML_QSPREAD                    // 1 (round 9, adopted): the in-place quantization's task u = v * ML_NCW + warp (was
#define ML_QSPREAD (!ML_AQ_OLD)       // warp * 4 + v): a chunk of 1-2 rows spreads over all consumer warps (run18 i: 0.983 -> 0.966)
#endif
#ifndef ML_REL_ATOM                   // 1 (round 9, adopted): the chunk counts and the last grid barrier as release atomics +
#define ML_REL_ATOM (!ML_AQ_OLD)      // acquire polls (fence.sc + relaxed atomic before; the barrier also ended on a fence)
#endif
#ifndef ML_DN_ROT                     // 1 (round 9, adopted): at M >= ML_DN_ROT_MIN_M, a CTA whose down range starts inside a chunk
#define ML_DN_ROT (!ML_AQ_OLD)        // (shared with the gate_up end of CTA c - 1) runs that chunk's items last, its own chunks first
#endif                                // (run18 m: 0.997 / 0.993 / 0.996 of the time at 32 / 64 / 128 tokens; 1.008 at 8)
#define ML_DN_ROT_MIN_M 32
#ifndef ML_PAIR_XS                    // 1 (round 9, adopted): a stage's warp pair spans two SM sub-partitions (warps 2s, 2s + 1),
#define ML_PAIR_XS (!ML_AQ_OLD)       // so the item's FP8 unpacking (F2FP) and HMMA work runs on two pipes instead of one
#endif
#ifndef ML_TIMING
#define ML_TIMING 0                   // 1 (exploration builds only): %globaltimer stamps per CTA and phase
#endif
#define ML_TIMING_ROW 1024            // stamps at y row 1024 (past the M * 8 routes): u64 [128 CTAs][16]
#define ML_EV_ITEMS 192               // ML_TIMING >= 2: per-item events in p.hq (unused by this build): u64 [128][3][192]

namespace {

__device__ __forceinline__ void stamp(const MlParams& p, int k) {
#if ML_TIMING
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  reinterpret_cast<unsigned long long*>(p.y + (size_t)ML_TIMING_ROW * HID)[blockIdx.x * 16 + k] = t;
#else
  (void)p;
  (void)k;
#endif
}
// ML_TIMING >= 2: event `kind` of local ring item j (0 copy issued, 1 landed as seen by a consumer, 2 released)
__device__ __forceinline__ void ev(const MlParams& p, int kind, int j) {
#if ML_TIMING >= 2
  if (j < ML_EV_ITEMS) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    reinterpret_cast<unsigned long long*>(p.hq)[(blockIdx.x * 3 + kind) * ML_EV_ITEMS + j] = t;
  }
#else
  (void)p;
  (void)kind;
  (void)j;
#endif
}

// ML_TIMING >= 2: event `kind` of the CTA's B chunk b (0 its copies issued, after the h poll; 1 the consumers past its
// quantization) in p.hs (unused by this build): u64 [128][2][8]
__device__ __forceinline__ void evb(const MlParams& p, int kind, int b) {
#if ML_TIMING >= 2
  if (b < 8) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    reinterpret_cast<unsigned long long*>(p.hs)[(blockIdx.x * 2 + kind) * 8 + b] = t;
  }
#else
  (void)p;
  (void)kind;
  (void)b;
#endif
}

#if ML_XST
// ML_XST: the ring slot of down item k (local, after ng gate_up items) and its use of that slot; the slot's pair is sl % 4
__device__ __forceinline__ void dn_slot(int k, int ng, bool xst, int& sl, int& use) {
  if (!xst || ML_XST == 0) {  // base: item j = ng + k in slot j % 4
    sl = (ng + k) % ML_STAGES;
    use = (ng + k) / ML_STAGES;
    return;
  }
  if (ML_XST == 1 || k < 6) {
    sl = ML_XST == 1 ? k % 6 : k;
    use = sl < ML_STAGES ? (ng > sl ? (ng - 1 - sl) / ML_STAGES + 1 : 0) + k / 6 : k / 6;
    return;
  }
  sl = (k - 6) % ML_STAGES;  // ML_XST 2 after the transition: slots 0-3 again, each past its first down use
  use = (ng > sl ? (ng - 1 - sl) / ML_STAGES + 1 : 0) + 1 + (k - 6) / ML_STAGES;
}
#endif

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
      const int u = ML_QSPREAD ? v * ML_NCW + wid : wid * 4 + v, row = r0 + u / G, grp = u % G;
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
      const int u = ML_QSPREAD ? v * ML_NCW + wid : wid * 4 + v, row = r0 + u / G, grp = u % G;
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

struct Meta {  // shared-memory route metadata (every CTA builds the same)
  unsigned tm[256][4];                 // token bit mask per expert
  int slot_start[257];                 // slot -> first position in the expert-major route list
  short slot_expert[256];
  int gchunk[MAX_GCHUNKS];             // gate_up chunk -> slot | chunk-in-slot << 16
  int dchunk[MAX_DCHUNKS];
  short prt[MAX_ROUTES];               // route-list position -> route (t * 8 + k)
  float pw[MAX_ROUTES];                // route-list position -> routing weight
  unsigned char slot_of[256];
  int nslots, ngc, ndc;
#if ML_OWNER_GO
  int pre_items;                       // weight items issued by the owner thread (ring slots 0 ..)
#endif
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
#if ML_REL_ATOM
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;\n" ::"l"(p.bar + ML_CNT_WORD + gci), "r"((unsigned)(hi - lo))
               : "memory");
#else
  __threadfence();
  atomicAdd(p.bar + ML_CNT_WORD + gci, (unsigned)(hi - lo));
#endif
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
__device__ __forceinline__ int gu_chunk(int gc0, int nbg, int b) { return ML_GU_REVERSE ? gc0 + nbg - 1 - b : gc0 + b; }

__device__ __forceinline__ void split(int n_items, int c, int& lo, int& hi) {
  lo = (int)(((long long)n_items * c) / ML_CTAS);
  hi = (int)(((long long)n_items * (c + 1)) / ML_CTAS);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(ML_THREADS, 1) moe_ml(const MlParams p) {
  extern __shared__ __align__(1024) uint8_t smem[];
  __shared__ Meta m;
  uint8_t* ring = smem + OFF_RING;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + OFF_BAR);
  uint64_t* empty = full + ML_SLOTS_DN;
  uint64_t* bfull = empty + ML_SLOTS_DN;
  uint64_t* bempty = bfull + 2;
  uint64_t* gridok = bempty + 2;
  uint64_t* bstart = gridok + 1;
#if ML_XST
  uint64_t* xfree = bstart + 1;  // [2]: x buffer b free (every warp past the last gate_up chunk in it)
  static_assert(!ML_WARM && !ML_AQ_OLD && ML_STAGES == 4, "ML_XST: the 4-stage build (fused or the round-11 twin)");
#endif
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const int c = blockIdx.x;
  const int M = p.M, R = M * TOPK;

  if (tid == 0) stamp(p, 0);  // entry
  if (tid == 0) {
    if (gridDim.x != ML_CTAS || blockDim.x != ML_THREADS || M < 1 || M > ML_MAXM) __trap();
    for (int s = 0; s < ML_SLOTS_DN; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 2);  // both warps of the stage's pair
    }
#if ML_XST
    mbar_init(&xfree[0], ML_NCW);
    mbar_init(&xfree[1], ML_NCW);
#endif
    for (int s = 0; s < 2; ++s) {
      mbar_init(&bfull[s], 1);
      mbar_init(&bempty[s], ML_NCW);
    }
    mbar_init(gridok, 1);
    mbar_init(bstart, 1);
    mbar_fence_init();
  }
#if ML_PDL
  pdl_wait();
  pdl_trigger();
#endif
  // the routes: ids and weights into registers (up to 6 per thread; ML_EARLY_GO: the consumer threads only, 4)
  constexpr int NRT = ML_EARLY_GO ? ML_NCW * 32 : ML_THREADS;
  constexpr int RPT = (MAX_ROUTES + NRT - 1) / NRT;
  int rid[RPT];
  float rw[RPT];
#pragma unroll
  for (int u = 0; u < RPT; ++u) {
    const int r = tid + NRT * u;
    rid[u] = r < R && (!ML_EARLY_GO || tid < NRT) ? __ldg(p.topk_ids + r) : -1;
    rw[u] = r < R && (!ML_EARLY_GO || tid < NRT) ? __ldg(p.topk_w + r) : 0.0f;
  }
  for (int i = tid; i < 256 * 4; i += ML_THREADS) (&m.tm[0][0])[i] = 0u;
  __syncthreads();
#pragma unroll
  for (int u = 0; u < RPT; ++u) {
    const int r = tid + NRT * u;
    if (r < R && (!ML_EARLY_GO || tid < NRT)) {
      if ((unsigned)rid[u] >= 256u) __trap();  // the contract: ids in [0, 256), distinct per token
      atomicOr(&m.tm[rid[u]][r >> 8], 1u << ((r >> 3) & 31));
    }
  }
  __syncthreads();
  if (tid == 0) stamp(p, 3);  // token masks
#if ML_META_PAR
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
    if (tid == 0) stamp(p, 6);  // the scans
#if ML_OWNER_GO
    {
      int tot = 0;  // the total chunk count, as m.ngc below
      for (int v = 0; v < 8; ++v) tot += wsum[v * 3 + 2];
      const long long NGI = (long long)tot * GU_PER_CHUNK;
      const int gb0 = (int)(NGI * c / ML_CTAS), ge0 = (int)(NGI * (c + 1) / ML_CTAS), gc00 = gb0 / GU_PER_CHUNK;
      if (M >= ML_OWNER_MAX_M) {
        if (tid == 0) m.pre_items = -1;  // not this time: the producers start as without ML_OWNER_GO
      } else if (k > 0 && gc <= gc00 && gc00 < gc + ch) {  // expert e holds the CTA's first gate_up item
        const int cis = gc00 - gc, n = min(GCH, k - cis * GCH);
        uint8_t* dst = smem + OFF_B;  // B buffer 0: the x rows first in this SM's copy queue, as the B producer's chunk 0
        mbar_expect_tx(&bfull[0], n * HID * 2 + 512);
        bulk_g2s(dst + B_WS, p.w13_scale + (size_t)e * 128, 512, &bfull[0]);
        issue_x_rows(p, m, e, cis * GCH, n, dst, &bfull[0]);
        const uint8_t* base = p.w13 + (size_t)e * 1024 * HID;
        int np = 0;
        for (; np < ML_PRE_ITEMS && np < ge0 - gb0 && (gb0 + np) / GU_PER_CHUNK < gc + ch; ++np) {
          const int col8 = (gb0 + np) % GU_PER_CHUNK;  // item gb0 + np -> ring slot np (first use)
          uint8_t* wd = smem + OFF_RING + np * STAGE_BYTES;
          mbar_expect_tx(&full[np], STAGE_BYTES);
          bulk_g2s(wd, base + (size_t)(8 * col8) * HID, HALF_BYTES, &full[np]);
          bulk_g2s(wd + HALF_BYTES, base + (size_t)(512 + 8 * col8) * HID, HALF_BYTES, &full[np]);
        }
        m.pre_items = np;
      }
    }
#endif
    if (k > 0) {
      m.slot_of[e] = (unsigned char)sl;
      m.slot_expert[sl] = (short)e;
      m.slot_start[sl] = pos;
      for (int u = 0; u < ch; ++u) m.gchunk[gc + u] = m.dchunk[gc + u] = sl | (u << 16);  // GCH == DCH
    }
    if (e == 255) {
      m.nslots = sl + nz;
      m.slot_start[sl + nz] = pos + k;
      m.ngc = gc + ch;
      m.ndc = gc + ch;
    }
  }
#else
  if (wid == 0) {  // slots, route-list starts and chunk tables: lane l owns experts [8l, 8l + 8)
    int cnt[8], ns = 0, nt = 0, ng = 0, nd = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int e = lane * 8 + i;
      cnt[i] = __popc(m.tm[e][0]) + __popc(m.tm[e][1]) + __popc(m.tm[e][2]) + __popc(m.tm[e][3]);
      ns += cnt[i] > 0;
      nt += cnt[i];
      ng += (cnt[i] + GCH - 1) / GCH;
      nd += (cnt[i] + DCH - 1) / DCH;
    }
    if (lane == 0) stamp(p, 6);  // warp 0: the expert counts
    int is = ns, it = nt, ig = ng, id = nd;  // inclusive warp scans
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int a = __shfl_up_sync(0xffffffffu, is, o), b = __shfl_up_sync(0xffffffffu, it, o);
      const int cg = __shfl_up_sync(0xffffffffu, ig, o), cd = __shfl_up_sync(0xffffffffu, id, o);
      if (lane >= o) {
        is += a;
        it += b;
        ig += cg;
        id += cd;
      }
    }
    if (lane == 0) stamp(p, 15);  // warp 0: the scans
    int sl = is - ns, pos = it - nt, gc = ig - ng, dc = id - nd;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int e = lane * 8 + i;
      if (cnt[i] == 0) continue;
      m.slot_of[e] = (unsigned char)sl;
      m.slot_expert[sl] = (short)e;
      m.slot_start[sl] = pos;
      for (int u = 0; u < (cnt[i] + GCH - 1) / GCH; ++u) m.gchunk[gc++] = sl | (u << 16);
      for (int u = 0; u < (cnt[i] + DCH - 1) / DCH; ++u) m.dchunk[dc++] = sl | (u << 16);
      ++sl;
      pos += cnt[i];
    }
    if (lane == 31) {
      m.nslots = sl;
      m.slot_start[sl] = pos;
      m.ngc = gc;
      m.ndc = dc;
    }
  }
#endif
  __syncthreads();
  if (tid == 0) stamp(p, 8);  // slot tables
  if (!ML_EARLY_GO || wid < ML_NCW) {
#pragma unroll
  for (int u = 0; u < RPT; ++u) {  // route r of token t to expert e -> position slot_start + (# tokens < t on e)
    const int r = tid + NRT * u;
    if (r < R && (!ML_EARLY_GO || tid < NRT)) {
      const int e = rid[u], t = r >> 3;
      int before = __popc(m.tm[e][t >> 5] & ((1u << (t & 31)) - 1u));
      for (int w = 0; w < (t >> 5); ++w) before += __popc(m.tm[e][w]);
      const int q = m.slot_start[m.slot_of[e]] + before;
      m.prt[q] = (short)r;
      m.pw[q] = rw[u];
    }
  }
  }
#if ML_EARLY_GO
  if (wid < ML_NCW) consumer_sync();  // prt / pw (read in the down epilogues); the producers are already going
#else
  __syncthreads();
#endif
  if (tid == 0) stamp(p, 1);  // metadata

  int gb, ge, db, de;
  split(m.ngc * GU_PER_CHUNK, c, gb, ge);
  split(m.ndc * DN_PER_CHUNK, c, db, de);
  const int ng = ge - gb, nd = de - db;                             // this CTA's items (ng, nd >= 4)
  const int gc0 = gb / GU_PER_CHUNK, nbg = (ge - 1) / GU_PER_CHUNK - gc0 + 1;
  const int dc0 = db / DN_PER_CHUNK, nbd = (de - 1) / DN_PER_CHUNK - dc0 + 1;
#if ML_DN_ROT  // the down order: chunks dc0 + 1 .. dc0 + nbd - 1 first, then dc0; items [cb, de) then [db, cb)
  const int drot = (M >= ML_DN_ROT_MIN_M && nbd > 1 && db % DN_PER_CHUNK != 0) ? 1 : 0;
  const int cb = drot ? (dc0 + 1) * DN_PER_CHUNK : db, nfirst = de - cb;
#define ML_DN_CHUNK(k) (dc0 + ((k) + drot) % nbd)                              // the CTA's k-th down chunk
#define ML_DN_ITEM(u) ((u) < nfirst ? cb + (u) : db + ((u) - nfirst))          // its u-th down item
#define ML_DN_LOCAL(i) ((i) >= cb ? (i) - cb : nfirst + ((i) - db))            // item i's place in that order
#else
#define ML_DN_CHUNK(k) (dc0 + (k))
#define ML_DN_ITEM(u) (db + (u))
#define ML_DN_LOCAL(i) ((i) - db)
#endif

  if (wid == ML_NCW) {  // ------------------------------------------------ weight producer
    if (lane == 0) {
#if ML_L2HINT
      const uint64_t pol_last = l2_evict_last(), pol_first = l2_evict_first();
#endif
#if ML_OWNER_GO
      const int j0 = max(m.pre_items, 0);  // the owner thread issued x, then items [0, j0) (-1: no owner this time)
      if (m.pre_items < 0) mbar_wait(bstart, 0);
#else
      const int j0 = 0;
      mbar_wait(bstart, 0);  // the first chunk's x rows go first in this SM's copy queue
#endif
      for (int j = j0; j < ng + nd; ++j) {
        const int s = j % ML_STAGES;
#if ML_XST
        // gate_up item j: slot j % 4, its use j / 4; down item k = j - ng: dn_slot
        int sl = s, use = j / ML_STAGES;
        if (j >= ng) dn_slot(j - ng, ng, M < ML_XST_MAX_M, sl, use);
        if (use >= 1) {
          mbar_wait(&empty[sl], (use - 1) & 1);
        } else if (sl >= ML_STAGES && nbg > sl - ML_STAGES) {
          mbar_wait(&xfree[sl - ML_STAGES], 0);  // the x buffer's last gate_up chunk is done
        }
        if (j == ng) stamp(p, 13);  // the first down copy issued
        uint8_t* dst = sl < ML_STAGES ? ring + sl * STAGE_BYTES : smem + OFF_B + (sl - ML_STAGES) * BBUF;
#define s sl
#else
        if (j >= ML_STAGES) mbar_wait(&empty[s], ((j / ML_STAGES) - 1) & 1);
        if (j == ng) stamp(p, 13);  // the first down copy issued
        uint8_t* dst = ring + s * STAGE_BYTES;
#endif
        mbar_expect_tx(&full[s], STAGE_BYTES);
#if ML_L2HINT
        {
          const int i = j < ng ? gb + j : ML_DN_ITEM(j - ng);
          const int sl2 = (j < ng ? m.gchunk[i / GU_PER_CHUNK] : m.dchunk[i / DN_PER_CHUNK]) & 0xffff;
          const bool multi = m.slot_start[sl2 + 1] - m.slot_start[sl2] > GCH;  // the expert streams twice or more
          const uint64_t pol = multi && ML_L2HINT < 3 ? pol_last : pol_first;  // 3: evict_first on every weight copy
          if (multi || ML_L2HINT >= 2) {
            const int e = m.slot_expert[sl2];
            if (j < ng) {
              const int col8 = i % GU_PER_CHUNK;
              const uint8_t* base = p.w13 + (size_t)e * 1024 * HID;
              bulk_g2s_hint(dst, base + (size_t)(8 * col8) * HID, HALF_BYTES, &full[s], pol);
              bulk_g2s_hint(dst + HALF_BYTES, base + (size_t)(512 + 8 * col8) * HID, HALF_BYTES, &full[s], pol);
            } else {
              bulk_g2s_hint(dst, p.w2 + ((size_t)e * HID + (i % DN_PER_CHUNK) * 64) * INTER, STAGE_BYTES, &full[s], pol);
            }
            ev(p, 0, j);
            continue;
          }
        }
#endif
        if (j < ng) {
          const int i = ML_GU_REVERSE ? ge - 1 - j : gb + j, col8 = i % GU_PER_CHUNK;
          const int e = m.slot_expert[m.gchunk[i / GU_PER_CHUNK] & 0xffff];
          const uint8_t* base = p.w13 + (size_t)e * 1024 * HID;
          bulk_g2s(dst, base + (size_t)(8 * col8) * HID, HALF_BYTES, &full[s]);
          bulk_g2s(dst + HALF_BYTES, base + (size_t)(512 + 8 * col8) * HID, HALF_BYTES, &full[s]);
        } else {
          const int i = ML_DN_ITEM(j - ng), r64 = i % DN_PER_CHUNK;
          const int e = m.slot_expert[m.dchunk[i / DN_PER_CHUNK] & 0xffff];
          bulk_g2s(dst, p.w2 + ((size_t)e * HID + r64 * 64) * INTER, STAGE_BYTES, &full[s]);
        }
#if ML_XST
#undef s
#endif
        ev(p, 0, j);
      }
      stamp(p, 14);  // the last copy issued
    }
    return;
  }
  if (wid == ML_NCW + 1) {  // ------------------------------------------------ B producer
    if (lane == 0) {
#if ML_OWNER_GO
      for (int b = m.pre_items >= 0 ? 1 : 0; b < nbg + nbd; ++b) {  // chunk 0 from the owner thread (unless pre_items < 0)
#else
      for (int b = 0; b < nbg + nbd; ++b) {
#endif
        const int s = b & 1;
        if (b >= 2) mbar_wait(&bempty[s], ((b >> 1) - 1) & 1);
#if ML_CHUNK_FLAGS
        if (b >= nbg) {  // the chunk's h rows: every item of the gate_up chunk with the same index has published
          const unsigned* cnt = p.bar + ML_CNT_WORD + ML_DN_CHUNK(b - nbg);
          unsigned polls = 0;
          while (ld_acquire_gpu(cnt) < GU_PER_CHUNK) {
            __nanosleep(64);
            if (++polls == (1u << 24)) __trap();  // a count that cannot complete: fail instead of hanging
          }
          fence_proxy_async_global();
        }
#else
        if (b == nbg) {  // h is written by every CTA's generic stores: after the grid barrier (ML_CHUNK_FLAGS=0)
          mbar_wait(gridok, 0);
          fence_proxy_async_global();
        }
#endif
#if ML_XST  // down chunks: the h buffers (the first one clear of the gate_up exchange area)
        uint8_t* dst = b < nbg ? smem + OFF_B + s * BBUF : smem + OFF_XCH + (((b - nbg) & 1) ^ 1) * HBUF;
#else
        uint8_t* dst = smem + OFF_B + s * BBUF;
#endif
        int slot, p0, n, e;
        if (b < nbg) {
          chunk_of(m, m.gchunk[gu_chunk(gc0, nbg, b)], GCH, slot, p0, n, e);
          mbar_expect_tx(&bfull[s], n * HID * 2 + 512);
          bulk_g2s(dst + B_WS, p.w13_scale + (size_t)e * 128, 512, &bfull[s]);
#if ML_EARLY_GO
          {  // the chunk's tokens (set bits of the expert's token mask, ranks [cis * GCH, + n)): x rows, BF16
            issue_x_rows(p, m, e, (m.gchunk[gu_chunk(gc0, nbg, b)] >> 16) * GCH, n, dst, &bfull[s]);
          }
#else
          for (int i = 0; i < n; ++i)  // the chunk's tokens' x rows, BF16
            bulk_g2s(dst + i * XROW, p.x + (size_t)(m.prt[p0 + i] >> 3) * HID, HID * 2, &bfull[s]);
#endif
#if !ML_WAIT_XQ
          if (b == 0) mbar_arrive(bstart);
#endif
          evb(p, 0, b);
        } else {
          chunk_of(m, m.dchunk[ML_DN_CHUNK(b - nbg)], DCH, slot, p0, n, e);
#if ML_SEPARATE_AQ
          mbar_expect_tx(&bfull[s], n * (INTER + 16) + 256);
          bulk_g2s(dst + B_WS2, p.w2_scale + (size_t)e * 64, 256, &bfull[s]);
          bulk_g2s(dst + B_HS, p.hs + (size_t)p0 * 4, n * 16, &bfull[s]);
          for (int i = 0; i < n; ++i) bulk_g2s(dst + i * HROW, p.hq + (size_t)(p0 + i) * INTER, INTER, &bfull[s]);
#else
          mbar_expect_tx(&bfull[s], n * INTER * 2 + 256);
          bulk_g2s(dst + B_WS2, p.w2_scale + (size_t)e * 64, 256, &bfull[s]);
          for (int i = 0; i < n; ++i)  // the chunk's h rows, BF16 (slot order: contiguous)
            bulk_g2s(dst + i * HROW, p.hbuf + (size_t)(p0 + i) * INTER, INTER * 2, &bfull[s]);
#endif
          evb(p, 0, b);
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
  const bool dry = ML_WARM && wid == ML_WARM_WARP;  // the warm-up warp: phase 4's code once, no waits, arrivals or stores
#if ML_PAIR_XS  // the pair = warps 2s, 2s + 1: two SM sub-partitions (warp % 4) share each item's MMA / FP8 unpacking work
  const int sw = dry ? 0 : wid >> 1, half = dry ? 0 : wid & 1;
#else           // the pair = warps s, s + ML_STAGES: with 4 stages both on sub-partition s
  const int sw = dry ? 0 : wid % ML_STAGES, half = dry ? 0 : wid / ML_STAGES;
#endif
  if (!dry) {  // phases 2 and 3 (the warm-up warp goes straight to phase 4)
    float* xch = reinterpret_cast<float*>(smem + OFF_XCH);
    for (int b = 0; b < nbg; ++b) {
      const int gci = gu_chunk(gc0, nbg, b);
      int slot, p0, n, e;
      chunk_of(m, m.gchunk[gci], GCH, slot, p0, n, e);
      uint8_t* bb = smem + OFF_B + (b & 1) * BBUF;
      float* bxs = reinterpret_cast<float*>(bb + B_XS);
      const float* bws = reinterpret_cast<const float*>(bb + B_WS);
      mbar_wait(&bfull[b & 1], (b >> 1) & 1);
      if (tid == 0 && b == 0) stamp(p, 4);  // the first gate_up B chunk in
      quant_rows_inplace<16>(bb, n, XROW, bxs, wid, lane);
      consumer_sync();
      if (tid == 0) evb(p, 1, b);
      if (tid == 0 && b == 0) stamp(p, 2);  // the first chunk's x quantized
#if ML_CHUNK_FLAGS
      if (tid == 0 && b > 0) publish_chunk(p, gu_chunk(gc0, nbg, b - 1), gb, ge);  // every warp is past chunk b - 1's items
#endif
#if ML_WAIT_XQ
      if (tid == 0 && b == 0) mbar_arrive(bstart);  // exploration: the weight stream starts only now
#endif
      const int lo = max(gb, gci * GU_PER_CHUNK), hi = min(ge, (gci + 1) * GU_PER_CHUNK);
#pragma unroll 1
#if ML_GU_REVERSE
      // local item j = ge - 1 - i: this chunk's items are local [ge - hi, ge - lo)
      for (int j = (ge - hi) + (((sw - (ge - hi)) % ML_STAGES) + ML_STAGES) % ML_STAGES; j < ge - lo; j += ML_STAGES) {
        const int i = ge - 1 - j, col8 = i % GU_PER_CHUNK;
#else
      for (int i = lo + (((sw - (lo - gb)) % ML_STAGES) + ML_STAGES) % ML_STAGES; i < hi; i += ML_STAGES) {
        const int j = i - gb, col8 = i % GU_PER_CHUNK;
#endif
        mbar_wait(&full[sw], (j / ML_STAGES) & 1);
        if (half == 0 && lane == 0) ev(p, 1, j);
        const uint8_t* tile = ring + sw * STAGE_BYTES + g * HID + t * 32;
        const float* wsg = bws + (col8 >> 4) * 16;
        const float* wsu = bws + (4 + (col8 >> 4)) * 16;
        float* xb = xch + (((j / ML_STAGES) & 1) * ML_STAGES + sw) * 4 * 32;  // [4][lane]
        const bool valid = g < n;
        const uint8_t* xrow = bb + g * XROW + t * 32;
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        if (half == 0) {
#pragma unroll 4
          for (int kb = 0; kb < (ML_NOMMA_GU ? 0 : 8); ++kb) {
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
#if ML_NOMMA_GU
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) {
          sts[kk] = 0.0f;
          d[kk][0] = d[kk][1] = d[kk][2] = d[kk][3] = 0.0f;
        }
#endif
#pragma unroll
        for (int kk = 0; kk < (ML_NOMMA_GU ? 0 : 8); ++kk) {
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
        if (lane == 0) ev(p, 2, j);
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
#if ML_SEPARATE_AQ
            p.hbuf[(size_t)(p0 + col) * 1024 + 8 * col8 + g] = __float2bfloat16_rn(acc[h2]);  // gate|up, as st8's cache
            p.hbuf[(size_t)(p0 + col) * 1024 + 512 + 8 * col8 + g] = __float2bfloat16_rn(acc[2 + h2]);
            (void)gt;
            (void)up;
#else
            p.hbuf[(size_t)(p0 + col) * INTER + 8 * col8 + g] = __float2bfloat16_rn(moe::silu_mul(gt, up));
#endif
          }
        }
      }
      // this warp's generic writes to the buffer (the in-place quantization) before the bulk copies that refill it
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#if ML_CHUNK_FLAGS
      fence_proxy_async_global();  // this thread's h stores, before other CTAs' bulk copies read them
#endif
      __syncwarp();
      if (lane == 0) mbar_arrive(&bempty[b & 1]);
#if ML_XST
      if (lane == 0 && b >= nbg - 2) mbar_arrive(&xfree[b & 1]);  // the buffer's last gate_up chunk
#endif
    }

    // phase 3: the last chunk's count (ML_CHUNK_FLAGS) or a grid barrier (h of every route in hbuf; the twin); the B
    // producer then copies each down chunk's h rows
    fence_proxy_async_global();  // this thread's h stores, before other CTAs' bulk copies read them
    consumer_sync();
#if ML_CHUNK_FLAGS
    if (tid == 0) {
      stamp(p, 5);  // gate_up done
      publish_chunk(p, gu_chunk(gc0, nbg, nbg - 1), gb, ge);
    }
#else
    if (tid == 0) {
      stamp(p, 5);  // gate_up done
      grid_arrive_wait(p.bar, gridDim.x);
      stamp(p, 6);  // grid barrier passed
#if !ML_SEPARATE_AQ
      mbar_arrive(gridok);
#endif
    }
    __syncwarp();
#endif
#if ML_SEPARATE_AQ
    // the A/B twin: SiLU*up + group quantization as a grid-wide step (st8's fused down prologue / moe_act_quant
    // arithmetic: 16 lanes x 8 values per (row, 128-group) pair), h_q / h_s to global, one more grid barrier
    consumer_sync();
    {
      const int hw = wid * 2 + (lane >> 4), sub = lane & 15;
      const int np = c < R * 4 ? (R * 4 - c + ML_CTAS - 1) / ML_CTAS : 0;  // pairs idx = u * 128 + c
#pragma unroll 1
      for (int u0 = 0; u0 < np; u0 += 2 * ML_NCW) {  // warp-uniform trip count (shuffles below)
        const int u = u0 + hw, idx = u * ML_CTAS + c;
        uint4 gv = make_uint4(0u, 0u, 0u, 0u), uv = gv;
        if (u < np) {
          const __nv_bfloat16* src = p.hbuf + (size_t)(idx >> 2) * 1024 + (idx & 3) * 128 + sub * 8;
          gv = __ldcg(reinterpret_cast<const uint4*>(src));
          uv = __ldcg(reinterpret_cast<const uint4*>(src + 512));
        }
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
        if (u < np) {
          const float sc = moe::group_scale(amax);
          uint2 q;
          q.x = moe::quant4(h[0], h[1], h[2], h[3], sc);
          q.y = moe::quant4(h[4], h[5], h[6], h[7], sc);
          *reinterpret_cast<uint2*>(p.hq + (size_t)(idx >> 2) * INTER + (idx & 3) * 128 + sub * 8) = q;
          if (sub == 0) p.hs[idx] = sc;
        }
      }
    }
    fence_proxy_async_global();
    consumer_sync();
    if (tid == 0) {
      grid_arrive_wait(p.bar, gridDim.x);
      mbar_arrive(gridok);
    }
    __syncwarp();
#endif

  }

  // phase 4: down items; local item j = ng + (i - db) (ML_DN_ROT: ng + the item's place in the rotated order)
  for (int b = nbg; b < (dry ? nbg + 1 : nbg + nbd); ++b) {
    const int dci = ML_DN_CHUNK(b - nbg);
    int slot, p0, n, e;
    chunk_of(m, m.dchunk[dci], DCH, slot, p0, n, e);
#if ML_XST
    uint8_t* bb = smem + OFF_XCH + (((b - nbg) & 1) ^ 1) * HBUF;
#else
    uint8_t* bb = smem + OFF_B + (b & 1) * BBUF;
#endif
    float* bhs = reinterpret_cast<float*>(bb + B_HS);
    const float* bws = reinterpret_cast<const float*>(bb + B_WS2);
    if (!dry) mbar_wait(&bfull[b & 1], (b >> 1) & 1);
    if (tid == 0 && b == nbg) stamp(p, 9);  // the first down B chunk in
#if !ML_SEPARATE_AQ
    if (!dry) {
      quant_rows_inplace<4>(bb, n, HROW, bhs, wid, lane);  // the chunk's h rows
      consumer_sync();
    }
    if (tid == 0) evb(p, 1, b);
#else
    (void)bhs;
#endif
    if (tid == 0 && b == nbg) stamp(p, 7);  // the first down chunk's h quantized
    const int lo = max(db, dci * DN_PER_CHUNK), hi = min(de, (dci + 1) * DN_PER_CHUNK);
#if ML_WARM
    const int ntile = dry ? 1 : (n + 7) >> 3;
#else
    const int ntile = (n + 7) >> 3;
#endif
#pragma unroll 1
#if ML_XST  // down item k sits in slot dn_slot(k), and slot s belongs to pair s % 4 (with 6 slots pairs 0 / 1 own two): every
            // use of a slot is consumed by one pair, in order, so a parity wait always targets the barrier's current phase
    for (int i = lo; i < hi; ++i) {
      const int j = ng + ML_DN_LOCAL(i), r64 = i % DN_PER_CHUNK;
      int sl, use;
      dn_slot(j - ng, ng, M < ML_XST_MAX_M, sl, use);
      if (sl % ML_STAGES != sw) continue;
#else
    for (int i = dry ? lo : lo + (((sw - (ng + ML_DN_LOCAL(lo))) % ML_STAGES) + ML_STAGES) % ML_STAGES; i < (dry ? lo + 1 : hi);
         i += ML_STAGES) {
      const int j = ng + ML_DN_LOCAL(i), r64 = i % DN_PER_CHUNK;
#endif
#if ML_XST
      mbar_wait(&full[sl], use & 1);
      const uint8_t* sbase = sl < ML_STAGES ? ring + sl * STAGE_BYTES : smem + OFF_B + (sl - ML_STAGES) * BBUF;
#else
      if (!dry) mbar_wait(&full[sw], (j / ML_STAGES) & 1);
      const int sl = sw;
      const uint8_t* sbase = ring + sw * STAGE_BYTES;
#endif
      if (half == 0 && lane == 0 && !dry) ev(p, 1, j);
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
        for (int kb = 0; kb < (ML_NOMMA_DN ? 0 : 4); ++kb) {
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
          if (lane == 0 && !dry) mbar_arrive(&empty[sl]);
          if (half == 1 && lane == 0) ev(p, 2, j);
        }
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {  // token column nt*8 + 2t + h2: acc[q][h2] row q*16 + g, acc[q][2 + h2] row + 8
          const int cc = nt * 8 + 2 * t + h2;
          if (cc < n && !dry) {
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
    if (lane == 0 && !dry) mbar_arrive(&bempty[b & 1]);
  }
#if ML_WARM < 2
  if (dry) return;
#else
  if (!dry) {  // ML_WARM 2: the warm-up warp also runs the top-k sum's code once (loads only)
#endif

  // phase 5: the last grid barrier (y complete), top-k sum in rank order (FP32), rounded once to BF16
  consumer_sync();
  if (tid == 0) {
    stamp(p, 10);  // down done
#if ML_REL_ATOM
    grid_arrive_wait_rel(p.bar + 64, gridDim.x);
#elif ML_MONO_BAR
    grid_arrive_wait_mono(p.bar + 64, gridDim.x);
#else
    grid_arrive_wait(p.bar, gridDim.x);
#endif
    stamp(p, 11);  // the last grid barrier passed
  }
  consumer_sync();
#if ML_CHUNK_FLAGS
  // every down chunk's producer has seen its count (they all precede the last grid barrier): zero them for the next launch
  for (int i = c * ML_NCW * 32 + tid; i < MAX_GCHUNKS; i += ML_CTAS * ML_NCW * 32) p.bar[ML_CNT_WORD + i] = 0u;
#endif
#if ML_WARM >= 2
  }
#endif
#if ML_WARM >= 2
  const int u0 = dry ? (c % M) * (HID / 8) + lane : c * (ML_NCW * 32) + tid;  // the warm-up warp: one unit per lane
  const int ustep = dry ? M * (HID / 8) : ML_CTAS * ML_NCW * 32;
#else
  const int u0 = c * (ML_NCW * 32) + tid, ustep = ML_CTAS * ML_NCW * 32;
#endif
#pragma unroll 1
  for (int u = u0; u < M * (HID / 8); u += ustep) {
    const int tk = u / (HID / 8), col = (u % (HID / 8)) * 8;
    uint4 v[TOPK];
#pragma unroll
    for (int k = 0; k < TOPK; ++k) v[k] = __ldcg(reinterpret_cast<const uint4*>(p.y + (size_t)(tk * TOPK + k) * HID + col));
    float s[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) s[i] = 0.0f;
#pragma unroll
    for (int k = 0; k < TOPK; ++k) {
      float f[8];
      moe::bf16x8_to_float(v[k], f);
#pragma unroll
      for (int i = 0; i < 8; ++i) s[i] += f[i];
    }
    uint4 o;
    __nv_bfloat162* o2 = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
    for (int i = 0; i < 4; ++i) o2[i] = __floats2bfloat162_rn(s[2 * i], s[2 * i + 1]);
#if ML_WARM >= 2
    if (!dry)
#endif
      *reinterpret_cast<uint4*>(p.out + (size_t)tk * HID + col) = o;
  }
  if (tid == 0) stamp(p, 12);  // top-k sum done (thread 0)
}
