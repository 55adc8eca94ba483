// Exploration (issue 7, round 6): how fast can one persistent CTA per SM stream MoE weight items from HBM,
// by TMA 1D bulk copies into a shared-memory ring (depth / chunk / consumer warps varied) or by plain
// 16-byte loads into registers? Not a contract: scripts/gpu/stream_probe.py (--build: nvcc here) builds and loads this code
// object and times each entry point on the same items.
//
// Items: the gate_up weights of D experts (2 MB each: 64 items of 32 KB), item i of CTA c = c + grid * q
// (moe_ms's distribution). Every byte is read once; a checksum per CTA keeps the loads alive.
#include "moe_sync.cuh"
#include <stdint.h>

#define ITEM 32768

struct ProbeParams {
  const uint8_t* w13;   // [E, 1024, 2048]
  const int* experts;   // [D]
  unsigned* sink;       // [grid]
  int D;
  int _pad;
};

namespace {

template <int S, int CHUNK, int NCW>
__device__ __forceinline__ void tma_body(const ProbeParams& p) {
  extern __shared__ __align__(1024) uint8_t smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + S * CHUNK);
  uint64_t* empty = full + S;
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  const int n_items = p.D * 64, c = blockIdx.x, G = gridDim.x;
  const int mine = c < n_items ? (n_items - c + G - 1) / G : 0;
  constexpr int PER = ITEM / CHUNK;
  const int n_st = mine * PER;
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 1);
    }
    mbar_fence_init();
  }
  __syncthreads();
  if (wid == NCW) {
    if (lane == 0) {
      for (int s = 0; s < n_st; ++s) {
        const int slot = s % S;
        if (s >= S) mbar_wait(&empty[slot], ((s / S) - 1) & 1);
        const int i = c + G * (s / PER), part = s % PER;
        const uint8_t* src = p.w13 + (size_t)__ldg(p.experts + (i >> 6)) * (64 * ITEM) + (size_t)(i & 63) * ITEM +
                             part * CHUNK;
        mbar_expect_tx(&full[slot], CHUNK);
        bulk_g2s(smem + slot * CHUNK, src, CHUNK, &full[slot]);
      }
    }
    return;
  }
  unsigned acc = 0;
  for (int s = wid; s < n_st; s += NCW) {  // S % NCW == 0: stage s always belongs to warp s % NCW
    const int slot = s % S;
    mbar_wait(&full[slot], (s / S) & 1);
    acc ^= reinterpret_cast<const unsigned*>(smem + slot * CHUNK)[lane];
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[slot]);
  }
  if (acc == 0x12345678u) p.sink[c] = acc;
}

template <int U>
__device__ __forceinline__ void ldg_body(const ProbeParams& p) {
  // every thread: U 16-byte loads in flight per round; a round covers U * blockDim.x * 16 bytes of
  // this CTA's items (consecutive items of the CTA are i = c + G q)
  const int n_items = p.D * 64, c = blockIdx.x, G = gridDim.x;
  const int mine = c < n_items ? (n_items - c + G - 1) / G : 0;
  const int per_item = ITEM / 16;  // 16-byte words per item
  const long long total = (long long)mine * per_item;
  uint4 x = make_uint4(0u, 0u, 0u, 0u);
  for (long long base = threadIdx.x; base < total; base += (long long)U * blockDim.x) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const long long w = base + (long long)u * blockDim.x;
      if (w < total) {
        const int q = (int)(w / per_item), off = (int)(w % per_item);
        const int i = c + G * q;
        const uint4* src = reinterpret_cast<const uint4*>(p.w13 + (size_t)__ldg(p.experts + (i >> 6)) * (64 * ITEM) +
                                                          (size_t)(i & 63) * ITEM) + off;
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w)
                     : "l"(src));
      } else {
        v[u] = make_uint4(0u, 0u, 0u, 0u);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      x.x ^= v[u].x;
      x.y ^= v[u].y;
      x.z ^= v[u].z;
      x.w ^= v[u].w;
    }
  }
  if ((x.x ^ x.y ^ x.z ^ x.w) == 0x12345678u) p.sink[c] = x.x;
}

}  // namespace

#define TMA(S, C, W)                                                                                 \
  extern "C" __global__ void __launch_bounds__(32 * (W + 1), 1) probe_tma_s##S##_c##C##_w##W(const ProbeParams p) { \
    tma_body<S, C * 1024, W>(p);                                                                    \
  }
TMA(5, 32, 5)
TMA(6, 32, 6)
TMA(7, 32, 7)
TMA(12, 16, 6)
TMA(14, 16, 7)
TMA(24, 8, 8)
TMA(6, 32, 3)
TMA(4, 32, 4)
TMA(3, 32, 3)

#define LDG(U, T)                                                                                    \
  extern "C" __global__ void __launch_bounds__(T, 1) probe_ldg_u##U##_t##T(const ProbeParams p) { ldg_body<U>(p); }
LDG(8, 256)
LDG(16, 256)
LDG(8, 512)
LDG(16, 512)
LDG(32, 256)
