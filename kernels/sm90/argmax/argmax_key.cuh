// The exact argmax key shared by the argmax kernels (argmax.cu; the rejected argmax_cluster.cu): each
// thread keeps the torch.argmax rule over the elements it saw (Best), and blocks/CTAs fold 64-bit keys
// with max: high 32 bits the value's order-preserving image (NaN above everything, +0 == -0), low 32
// bits ~index (lowest index wins among equal values). See argmax.cu's header for the argument.
#pragma once

namespace netra_argmax {

constexpr unsigned kNone = 0xFFFFFFFFu;  // "no element seen" index

__device__ __forceinline__ float max_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// Thread state: the sequential torch.argmax rule over the elements it saw, in index order.
struct Best {
  float value;
  unsigned index;  // kNone until the first element
  bool nan;
};

// Does a value equal the batch maximum m? NaN-aware (m is NaN iff the batch holds a NaN); +0 == -0.
__device__ __forceinline__ bool matches(float value, float m, bool m_nan) {
  return m_nan ? (value != value) : (value == m);
}

__device__ __forceinline__ unsigned long long to_key(const Best& b) {
  if (b.index == kNone) return 0ull;  // below every real key (real keys have ~index > 0)
  unsigned ordered;
  const unsigned bits = __float_as_uint(b.value);
  if (b.nan) {
    ordered = 0xFFFFFFFFu;
  } else if ((bits & 0x7FFFFFFFu) == 0u) {
    ordered = 0x80000000u;  // +0 and -0 compare equal
  } else {
    ordered = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  }
  return (static_cast<unsigned long long>(ordered) << 32) | static_cast<unsigned long long>(~b.index);
}

__device__ __forceinline__ unsigned long long warp_max(unsigned long long k) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const unsigned long long o = __shfl_down_sync(0xFFFFFFFFu, k, off);
    k = o > k ? o : k;
  }
  return k;
}

}  // namespace netra_argmax
