// Row argmax, float32 logits, decode batch sizes (rows 2-16), for sm90 (H100/H200): one thread-block
// cluster per row, TMA bulk copies into shared memory, a fold through distributed shared memory.
//
// Contract: kernels/sm90/argmax/argmax_f32_cluster.contract.json (launch: cluster 8, PDL).
//
// Why. The chunked kernel (argmax.cu) at 16 rows spends measurably more than the launch node and the
// byte floor (results/sm90/NOTES.md, argmax): its 256 blocks x 256 threads x 8 x 16 B = 8.4 MB first load wave does not cover the
// 15.9 MB input, so a second, dependent wave waits for the first; and its cross-block fold is a
// chain of global atomics (RED, acq_rel arrival, exchange: several L2 round trips). Here:
//   * one CTA per SM (128 KB of dynamic shared memory per CTA), C = cluster size CTAs per row
//     (16 rows x 8 = 128 CTAs <= 132 SMs); each CTA owns 1/C of its row (124,160 B at C = 8);
//   * thread 0 requests the whole chunk at kernel start with cp.async.bulk (TMA, 1D) in pieces of
//     16 KB, one mbarrier per piece, so every byte of the input is in flight at once (no second
//     wave), and the threads reduce each piece as it lands; when a chunk exceeds the kSlots-piece
//     ring (cluster < 8, exploration only) a slot is refilled once every thread has read it;
//   * the C block keys of a row meet in the leader CTA's shared memory (st.shared::cluster on a
//     mapa address, then barrier.cluster arrive.release / wait.acquire): no global atomics, no
//     workspace, nothing to reset between graph replays.
//
// PDL. Setup (mbarrier init, the first cluster arrival) runs before griddepcontrol.wait; logits are
// read only after it. The kernel never calls griddepcontrol.launch_dependents: the trigger is
// implicit at exit, so the next kernel overlaps only our exit (in production the LM-head GEMM before
// argmax does not trigger early either, so our own prologue overlap is what any predecessor gives).
//
// Exactness: the same rule and 64-bit key as argmax.cu (first NaN wins; ties -> lowest index;
// +0 == -0; infinities ordered; subnormals compared exactly: no -ftz, max.NaN filter). Each thread
// visits its elements in increasing index order (piece by piece, lane by lane), so the per-thread
// sequential rule holds; keys then fold by max (order-free, bitwise deterministic).
//
// probe != 0 (benchmark floor probe): the same TMA stream and waits, no compute, no output: the
// lowest time this launch shape and protocol allow for the bytes.

#include <cstddef>
#include <cstdint>

#include "argmax_key.cuh"

struct ArgmaxClusterParams {
  const float* x;              // [rows, row_stride] logits, 16-byte aligned base
  long long* out;              // [rows] int64 indices
  long long row_stride;        // elements between rows (a multiple of 4)
  int rows;
  int vocab;                   // elements per row, a multiple of 4
  int probe;                   // 1: read-only floor probe (no compute, no output)
  int pad_;
};
static_assert(sizeof(ArgmaxClusterParams) == 40, "ArgmaxClusterParams size");
static_assert(offsetof(ArgmaxClusterParams, x) == 0 && offsetof(ArgmaxClusterParams, out) == 8 &&
              offsetof(ArgmaxClusterParams, row_stride) == 16 && offsetof(ArgmaxClusterParams, rows) == 24 &&
              offsetof(ArgmaxClusterParams, vocab) == 28 && offsetof(ArgmaxClusterParams, probe) == 32,
              "ArgmaxClusterParams offsets");

extern "C" __device__ unsigned int netra_params_layout[7] = {
    sizeof(ArgmaxClusterParams),          offsetof(ArgmaxClusterParams, x),
    offsetof(ArgmaxClusterParams, out),   offsetof(ArgmaxClusterParams, row_stride),
    offsetof(ArgmaxClusterParams, rows),  offsetof(ArgmaxClusterParams, vocab),
    offsetof(ArgmaxClusterParams, probe)};

namespace {

using namespace netra_argmax;  // kNone, max_nan, Best, matches, to_key, warp_max (argmax_key.cuh)

constexpr int kBlock = 256;
constexpr int kPieceVecs = 1024;                 // 16 KB pieces: 4 x 16-byte loads per thread
constexpr int kLoads = kPieceVecs / kBlock;      // 4
constexpr int kSlots = 8;                        // 8 x 16 KB = 128 KB: a whole 1/8 row at once
constexpr int kMaxCluster = 16;
constexpr unsigned kNegInf = 0xFF800000u;
static_assert(kPieceVecs % kBlock == 0, "piece = whole loads per thread");

__device__ __forceinline__ float vec_max(const uint4& r) {
  return max_nan(max_nan(__uint_as_float(r.x), __uint_as_float(r.y)),
                 max_nan(__uint_as_float(r.z), __uint_as_float(r.w)));
}

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ unsigned cluster_ctarank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

__device__ __forceinline__ unsigned cluster_nctarank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
  return r;
}

__device__ __forceinline__ unsigned cluster_id_x() {
  unsigned r;
  asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(r));
  return r;
}

__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  unsigned done;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  } while (!done);
}

// Thread 0: arm the slot's mbarrier with the piece's byte count, then one bulk copy global -> smem.
__device__ __forceinline__ void issue_piece(unsigned dst, unsigned bar, const uint4* src, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
      :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kBlock, 1) netra_argmax_cluster_sm90(const ArgmaxClusterParams p) {
  extern __shared__ __align__(128) uint4 ring[];  // kSlots x kPieceVecs x 16 B (dynamic)
  __shared__ __align__(8) unsigned long long bars[kSlots];
  __shared__ unsigned long long warp_keys[kBlock / 32];
  __shared__ unsigned long long cluster_keys[kMaxCluster];  // the leader's: one key per CTA

  const unsigned tid = threadIdx.x;
  const unsigned crank = cluster_ctarank();
  const unsigned csize = cluster_nctarank();
  const int row = static_cast<int>(cluster_id_x());

  // Setup, overlappable with the previous kernel under PDL: barriers, and the first cluster
  // arrival (paired with the wait before the fold: every CTA of the cluster is running before
  // anyone writes into the leader's shared memory).
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_addr(&bars[s])) : "memory");
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");

  const int nvec = p.vocab >> 2;
  const int v0 = static_cast<int>((static_cast<long long>(crank) * nvec) / csize);
  const int v1 = static_cast<int>((static_cast<long long>(crank + 1) * nvec) / csize);
  const int n = v1 - v0;
  const int pieces = (n + kPieceVecs - 1) / kPieceVecs;
  const uint4* src = reinterpret_cast<const uint4*>(p.x + static_cast<long long>(row) * p.row_stride) + v0;
  const unsigned ring0 = smem_addr(ring);
  const unsigned bar0 = smem_addr(bars);

  if (tid == 0) {
    const int first = pieces < kSlots ? pieces : kSlots;
    for (int k = 0; k < first; ++k) {
      const int cnt = min(kPieceVecs, n - k * kPieceVecs);
      issue_piece(ring0 + k * kPieceVecs * 16, bar0 + k * 8, src + k * kPieceVecs, cnt * 16);
    }
  }

  Best best{0.0f, kNone, false};
  for (int k = 0; k < pieces; ++k) {
    const int slot = k % kSlots;
    mbar_wait(bar0 + slot * 8, static_cast<unsigned>((k / kSlots) & 1));
    const int cnt = min(kPieceVecs, n - k * kPieceVecs);
    if (!p.probe && static_cast<int>(tid) < cnt) {
      // Lane u = 0 is in the piece; lanes past its end read as -inf (never the lowest match of a
      // real maximum, since lane 0 is real and lanes grow in index).
      const uint4* piece = ring + slot * kPieceVecs;
      uint4 raw[kLoads];
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {
        const int vi = static_cast<int>(tid) + u * kBlock;
        raw[u] = vi < cnt ? piece[vi] : make_uint4(kNegInf, kNegInf, kNegInf, kNegInf);
      }
      float mv[kLoads];
#pragma unroll
      for (int u = 0; u < kLoads; ++u) mv[u] = vec_max(raw[u]);
      float m = mv[0];
#pragma unroll
      for (int u = 1; u < kLoads; ++u) m = max_nan(m, mv[u]);
      const bool m_nan = m != m;
      if (!best.nan && (m_nan || best.index == kNone || m > best.value)) {
        uint4 hit = raw[kLoads - 1];
        int hit_u = kLoads - 1;
#pragma unroll
        for (int u = kLoads - 2; u >= 0; --u) {
          if (matches(mv[u], m, m_nan)) {
            hit = raw[u];
            hit_u = u;
          }
        }
        const float e[4] = {__uint_as_float(hit.x), __uint_as_float(hit.y), __uint_as_float(hit.z),
                            __uint_as_float(hit.w)};
        int hit_j = 3;
#pragma unroll
        for (int j = 2; j >= 0; --j) {
          if (matches(e[j], m, m_nan)) hit_j = j;
        }
        best.value = m;
        best.nan = m_nan;
        best.index = static_cast<unsigned>((v0 + k * kPieceVecs + static_cast<int>(tid) + hit_u * kBlock) * 4 + hit_j);
      }
    }
    if (k + kSlots < pieces) {  // ring refill (chunks above 128 KB): every thread has read the slot
      __syncthreads();
      if (tid == 0) {
        const int kn = k + kSlots;
        const int cn = min(kPieceVecs, n - kn * kPieceVecs);
        issue_piece(ring0 + slot * kPieceVecs * 16, bar0 + slot * 8, src + kn * kPieceVecs, cn * 16);
      }
    }
  }
  if (p.probe) return;  // floor probe: the leader's shared memory is never touched

  // Block reduction of the 64-bit keys.
  unsigned long long key = warp_max(to_key(best));
  const unsigned lane = tid & 31;
  const unsigned warp = tid >> 5;
  if (lane == 0) warp_keys[warp] = key;
  __syncthreads();
  if (warp == 0) {
    key = lane < kBlock / 32 ? warp_keys[lane] : 0ull;
    key = warp_max(key);
  }
  // Every CTA of the cluster has started (its first arrival): the leader's shared memory exists.
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
  if (tid == 0) {
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, 0;" : "=r"(remote) : "r"(smem_addr(&cluster_keys[crank])));
    asm volatile("st.shared::cluster.u64 [%0], %1;" :: "r"(remote), "l"(key) : "memory");
  }
  // Release our store to the leader, which reads the keys after its acquire. Every CTA waits too
  // (the programming guide asks that a block's distributed-shared-memory operations complete before
  // it exits; the wait ends when the last CTA arrives, about when the leader could start anyway).
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
  if (crank != 0) return;
  if (warp == 0) {
    key = lane < csize ? cluster_keys[lane] : 0ull;
    key = warp_max(key);
    if (lane == 0) p.out[row] = static_cast<long long>(~static_cast<unsigned>(key & 0xFFFFFFFFull));
  }
}
