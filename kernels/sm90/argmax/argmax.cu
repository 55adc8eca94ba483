// Row argmax with torch.argmax semantics, one launch, for sm90 (H100/H200).
//
// Contract: kernels/sm90/argmax/argmax_{f32,bf16}.contract.json. Built twice from this file:
// -DNETRA_ARGMAX_BF16=0 (float32 logits) and =1 (bfloat16 logits).
//
// Why this shape. torch.argmax walks a row in one block, so at decode batch sizes (1-16 rows) it
// keeps a handful of SMs busy and waits on latency. Here each row is split into `chunks` pieces and
// every block reads one piece with 16-byte streaming loads, UNROLL loads in flight per thread, so
// rows * chunks blocks fill the 132 SMs whatever the row count (the host picks chunks).
//
// Exactness. The answer per row is the maximum of a 64-bit key:
//   high 32 bits: the value's order-preserving image (NaN -> 0xFFFFFFFF above everything,
//                 +0 and -0 -> 0x80000000, negatives bit-flipped, positives with the sign set),
//   low 32 bits:  ~index, so that among equal values the lowest index has the largest key.
// max over keys is exact, associative and commutative, so the result is the same whatever the
// order blocks finish in (bitwise deterministic), and equals torch.argmax: first NaN wins, ties go
// to the lowest index, +0 == -0, infinities ordered. Subnormals are compared exactly: no -ftz, no
// fast math; the batch filter uses max.NaN (NaN-propagating, subnormal-preserving).
//
// Per element the hot loop does one NaN-propagating max (bf16: half of one, on packed pairs). Per
// batch of kUnroll loads, the thread compares the batch maximum m with its best; only when m wins
// (a NaN, a strictly larger value, or the first batch) does it locate m's first occurrence in the
// batch, with select chains over the per-load maxima and then over one load's elements. Rescanning
// the whole batch element by element instead (an earlier version) made bf16 compute-bound at 128 rows:
// a winning batch is frequent there (results/sm90/NOTES.md, argmax).
//
// Cross-block fold (graph-safe, one launch): each block atomicMax-es its key into the row's slot
// of a persistent workspace, fences, and bumps the row's counter; the block that brings the counter
// to `chunks` reads the key with atomicExch(key, 0), resets the counter to 0 and writes the index.
// Every launch thus leaves the workspace zeroed as it found it, so CUDA-graph replays need no memset.

#include <cstddef>
#include <cstdint>
#include <cuda_bf16.h>

#include "argmax_key.cuh"

#ifndef NETRA_ARGMAX_BF16
#error "build with -DNETRA_ARGMAX_BF16=0 (float32) or =1 (bfloat16)"
#endif

// The launch-argument struct, passed by value. Its host mirror is ArgmaxParams in
// netra/ops/argmax.py; both are checked against the contract's kernel.params_layout (CPU test)
// and against netra_params_layout below (at load, on the GPU).
struct ArgmaxParams {
  const void* x;               // [rows, row_stride] logits, 16-byte aligned base
  long long* out;              // [rows] int64 indices
  unsigned long long* keys;    // [256] workspace, zero between launches
  unsigned int* counters;      // [256] workspace, zero between launches
  long long row_stride;        // elements between rows
  int rows;
  int vocab;                   // elements per row, a multiple of VEC
  int chunks;                  // blocks per row
  int pad_;
};
static_assert(sizeof(ArgmaxParams) == 56, "ArgmaxParams size");
static_assert(offsetof(ArgmaxParams, x) == 0 && offsetof(ArgmaxParams, out) == 8 &&
              offsetof(ArgmaxParams, keys) == 16 && offsetof(ArgmaxParams, counters) == 24 &&
              offsetof(ArgmaxParams, row_stride) == 32 && offsetof(ArgmaxParams, rows) == 40 &&
              offsetof(ArgmaxParams, vocab) == 44 && offsetof(ArgmaxParams, chunks) == 48,
              "ArgmaxParams offsets");

// sizeof, then offsetof each field in the contract's params_layout order; read by the runtime.
extern "C" __device__ unsigned int netra_params_layout[9] = {
    sizeof(ArgmaxParams),         offsetof(ArgmaxParams, x),    offsetof(ArgmaxParams, out),
    offsetof(ArgmaxParams, keys), offsetof(ArgmaxParams, counters),
    offsetof(ArgmaxParams, row_stride), offsetof(ArgmaxParams, rows),
    offsetof(ArgmaxParams, vocab), offsetof(ArgmaxParams, chunks)};

namespace {

using namespace netra_argmax;

constexpr int kBlock = 256;
#ifndef NETRA_ARGMAX_UNROLL
#define NETRA_ARGMAX_UNROLL 8                    // 16 B loads in flight per thread (the contract's build)
#endif
constexpr int kVec = NETRA_ARGMAX_BF16 ? 8 : 4;  // elements per 16-byte load
// A 32-bit word of -inf: one float32 -inf, or two bfloat16 -inf.
constexpr unsigned kNegInf4 = NETRA_ARGMAX_BF16 ? 0xFF80FF80u : 0xFF800000u;

// One 16-byte load (streaming: logits are read once) unpacked to kVec floats.
struct Vec {
  float v[kVec];
};

__device__ __forceinline__ uint4 load16(const uint4* p) { return __ldcs(p); }

__device__ __forceinline__ void unpack(const uint4& raw, Vec& out) {
#if NETRA_ARGMAX_BF16
  const unsigned w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out.v[2 * i] = __uint_as_float(w[i] << 16);              // bf16 -> fp32 is exact
    out.v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
  }
#else
  out.v[0] = __uint_as_float(raw.x);
  out.v[1] = __uint_as_float(raw.y);
  out.v[2] = __uint_as_float(raw.z);
  out.v[3] = __uint_as_float(raw.w);
#endif
}

// Maximum of one 16-byte load, NaN-propagating. For bf16, 4 packed bf16x2 maxima then 1 fp32.
__device__ __forceinline__ float vec_max(const uint4& raw) {
#if NETRA_ARGMAX_BF16
  __nv_bfloat162 a = *reinterpret_cast<const __nv_bfloat162*>(&raw.x);
  __nv_bfloat162 b = *reinterpret_cast<const __nv_bfloat162*>(&raw.y);
  __nv_bfloat162 c = *reinterpret_cast<const __nv_bfloat162*>(&raw.z);
  __nv_bfloat162 d = *reinterpret_cast<const __nv_bfloat162*>(&raw.w);
  __nv_bfloat162 m = __hmax2_nan(__hmax2_nan(a, b), __hmax2_nan(c, d));
  return max_nan(__low2float(m), __high2float(m));
#else
  return max_nan(max_nan(__uint_as_float(raw.x), __uint_as_float(raw.y)),
                 max_nan(__uint_as_float(raw.z), __uint_as_float(raw.w)));
#endif
}

}  // namespace

// The kernel body, for a batch of kUnroll loads per thread. kProbe: the fold-free probe (every byte
// loaded once and each thread's running argmax kept, but no block reduction, no cross-block fold and
// no output: it writes only on an impossible index), i.e. the kernel's time minus its reduction tail.
template <int kUnroll, bool kProbe>
__device__ __forceinline__ void argmax_body(const ArgmaxParams& p) {
  // Programmatic dependent launch (a no-op unless launched with the PDL attribute): wait until the
  // previous kernel in the stream has finished and its writes (our logits, and the workspace a
  // previous argmax reset) are visible. Dependents are NOT triggered early (the trigger is implicit
  // at block exit): in production the next kernel is not an argmax, so an early trigger would only
  // flatter the benchmark's chain of argmax calls.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const int row = blockIdx.x / p.chunks;
  const int chunk = blockIdx.x - row * p.chunks;
  const int nvec = p.vocab / kVec;
  const int v0 = static_cast<int>((static_cast<long long>(chunk) * nvec) / p.chunks);
  const int v1 = static_cast<int>((static_cast<long long>(chunk + 1) * nvec) / p.chunks);
  const size_t elem_bytes = NETRA_ARGMAX_BF16 ? 2 : 4;
  const uint4* base = reinterpret_cast<const uint4*>(static_cast<const char*>(p.x) +
                                                     static_cast<size_t>(row) * p.row_stride * elem_bytes);

  Best best{0.0f, kNone, false};
  // Batches of kUnroll independent 16-byte loads per thread, all issued before any is used; the
  // last batch of a chunk is predicated (out-of-chunk lanes read as -inf; lane u = 0 is always in
  // the chunk and lanes grow in index with u, so the lowest matching lane below is a real element).
  // At decode batch sizes a chunk is one partial batch: the whole chunk is in flight at once.
  for (int v = v0 + static_cast<int>(threadIdx.x); v < v1; v += kUnroll * kBlock) {
    uint4 raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int vi = v + u * kBlock;
      raw[u] = vi < v1 ? load16(base + vi) : make_uint4(kNegInf4, kNegInf4, kNegInf4, kNegInf4);
    }
    float mv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) mv[u] = vec_max(raw[u]);
    float m = mv[0];
#pragma unroll
    for (int u = 1; u < kUnroll; ++u) m = max_nan(m, mv[u]);
    const bool m_nan = m != m;
    // The batch changes the answer only with a NaN (the first one wins), a strictly larger value
    // (equal values keep the earlier index), or when nothing was seen yet.
    if (!best.nan && (m_nan || best.index == kNone || m > best.value)) {
      // Its first element equal to m: the lowest lane u whose load holds m, then the lowest j.
      // Select chains, not a runtime index, so raw[] stays in registers.
      uint4 hit = raw[kUnroll - 1];
      int hit_u = kUnroll - 1;
#pragma unroll
      for (int u = kUnroll - 2; u >= 0; --u) {
        if (matches(mv[u], m, m_nan)) {
          hit = raw[u];
          hit_u = u;
        }
      }
      Vec e;
      unpack(hit, e);
      int hit_j = kVec - 1;
#pragma unroll
      for (int j = kVec - 2; j >= 0; --j) {
        if (matches(e.v[j], m, m_nan)) hit_j = j;
      }
      best.value = m;
      best.nan = m_nan;
      best.index = static_cast<unsigned>((v + hit_u * kBlock) * kVec + hit_j);
    }
  }

  if constexpr (kProbe) {  // no block reduction, no fold: keep the thread's result alive, write never
    if (best.index == 0xFFFFFFFEu && threadIdx.x == 1023u) p.out[row] = best.index;
    return;
  }
  // Block reduction of the 64-bit keys.
  __shared__ unsigned long long warp_keys[kBlock / 32];
  unsigned long long key = warp_max(to_key(best));
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  if (lane == 0) warp_keys[warp] = key;
  __syncthreads();
  if (warp != 0) return;
  key = lane < kBlock / 32 ? warp_keys[lane] : 0ull;
  key = warp_max(key);
  if (lane != 0) return;

  if (p.chunks == 1) {
    p.out[row] = static_cast<long long>(~static_cast<unsigned>(key & 0xFFFFFFFFull));
    return;
  }
  // Relaxed max (a fire-and-forget RED), then an acq_rel arrival: release orders our RED before
  // the arrival, and the last block's acquire makes every other block's RED visible to it. This is
  // the serial tail of the kernel, so it uses one ordering point instead of two __threadfence()
  // (fence.sc.gpu) around the arrival.
  atomicMax(p.keys + row, key);
  unsigned arrived;
  asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], 1;" : "=r"(arrived) : "l"(p.counters + row) : "memory");
  if (arrived == static_cast<unsigned>(p.chunks - 1)) {
    unsigned long long final_key;
    asm volatile("atom.exch.relaxed.gpu.global.b64 %0, [%1], 0;" : "=l"(final_key) : "l"(p.keys + row) : "memory");
    asm volatile("st.relaxed.gpu.global.u32 [%0], 0;" :: "l"(p.counters + row) : "memory");
    p.out[row] = static_cast<long long>(~static_cast<unsigned>(final_key & 0xFFFFFFFFull));
  }
}

// The contract's symbol (kUnroll from the build flags), and two exploration entry points measured
// beside it by `netra bench kernels` (resolved from the same code object): 16 loads per thread
// (a [16]-row chunk is then one batch: every load of the call in flight at once) and the probe.
extern "C" __global__ void __launch_bounds__(kBlock) netra_argmax_sm90(const ArgmaxParams p) {
  argmax_body<NETRA_ARGMAX_UNROLL, false>(p);
}
extern "C" __global__ void __launch_bounds__(kBlock) netra_argmax_u16_sm90(const ArgmaxParams p) {
  argmax_body<16, false>(p);
}
extern "C" __global__ void __launch_bounds__(kBlock) netra_argmax_probe_sm90(const ArgmaxParams p) {
  argmax_body<16, true>(p);
}
