// PTX wrappers shared by the sm90 MoE streaming kernels (expert_stream.cu, moe_m1.cu, moe_m1f.cu, moe_ms.cu, moe_ml.cu):
// mbarriers, TMA 1D bulk copies, GPU-scope acquire/release, PDL, and the grid-wide barrier of the
// cooperative one-kernel layers. Everything here is in an anonymous namespace (inlined per code object).
#pragma once
#include <stdint.h>

namespace {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, unsigned parity) {
  uint32_t ok;
  asm volatile(
      "{\n"
      ".reg .pred P1;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%1], %2;\n"
      "selp.u32 %0, 1, 0, P1;\n"
      "}\n"
      : "=r"(ok)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
  return ok != 0u;
}
// A wait that cannot end (a broken ring) traps after ~2^24 polls instead of hanging the GPU: the
// launch then fails with an error the host sees (each poll suspends up to a hardware time limit).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
  unsigned polls = 0;
  while (!mbar_try_wait(bar, parity)) {
    if (++polls == (1u << 24)) __trap();
  }
}
__device__ __forceinline__ void bulk_g2s(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}
// bulk_g2s with an L2 cache policy (createpolicy: l2_evict_first / l2_evict_last below), issue 7
__device__ __forceinline__ void bulk_g2s_hint(void* dst, const void* src, unsigned bytes, uint64_t* bar, uint64_t pol) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n" ::"r"(
          smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar)), "l"(pol)
      : "memory");
}
__device__ __forceinline__ uint64_t l2_evict_first() {
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
  return pol;
}
__device__ __forceinline__ uint64_t l2_evict_last() {
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(pol));
  return pol;
}
// Release (before the arrival atomic) / acquire (after the last arrival) at GPU scope: the PTX
// memory model's fence + relaxed-atomic pattern, lighter than __threadfence()'s fence.sc.
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;\n" ::: "memory"); }
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

__device__ __forceinline__ unsigned ld_acquire_gpu(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_gpu(unsigned* p, unsigned v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// Grid-wide barrier, the part one thread per CTA runs between two CTA-level barriers (a cooperative
// launch: every CTA is resident). It reads the generation, releases the CTA's prior writes (fence +
// atomic arrival); the last arrival resets the count and publishes generation + 1 (release); the
// others poll it (acquire). bar: word 0 the arrival count (returns to 0 every time), word 32 the
// generation (only increments): replays need no memset.
__device__ __forceinline__ void grid_arrive_wait(unsigned* bar, unsigned ctas) {
  unsigned* count = bar;
  unsigned* gen = bar + 32;
  const unsigned g0 = ld_acquire_gpu(gen);
  __threadfence();
  const unsigned prev = atomicAdd(count, 1u);
  if (prev == ctas - 1u) {
    atomicExch(count, 0u);
    __threadfence();
    st_release_gpu(gen, g0 + 1u);
  } else {
    unsigned polls = 0;
    while (ld_acquire_gpu(gen) == g0) {
      if (++polls == (1u << 26)) __trap();  // a broken count: fail the launch instead of hanging
    }
  }
  __threadfence();
}

// Grid-wide barrier on a count that only grows (moe_ml): every launch adds exactly `ctas` (a power of two)
// arrivals, so an arrival's launch is prev / ctas and the barrier ends when the count reaches the next multiple
// of ctas. No generation read before the arrival and no reset after the last one: the last arrival's atomic is
// the release every CTA polls for (one round trip less on each side than grid_arrive_wait).
__device__ __forceinline__ void grid_arrive_wait_mono(unsigned* count, unsigned ctas) {
  __threadfence();
  const unsigned prev = atomicAdd(count, 1u);
  const unsigned target = prev - (prev & (ctas - 1u)) + ctas;
  unsigned polls = 0;
  while ((int)(ld_acquire_gpu(count) - target) < 0) {
    if (++polls == (1u << 26)) __trap();  // a broken count: fail the launch instead of hanging
  }
  __threadfence();
}

}  // namespace
