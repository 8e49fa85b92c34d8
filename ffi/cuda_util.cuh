// Device helpers shared by every jaxgemv kernel: typed activations, cache-hinted loads, mma.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>
#include <utility>

namespace jaxgemv {

// Per activation type: the packed pair type and the matching mma operand spelling.
template <typename T>
struct Act;

template <>
struct Act<__half> {
  using T2 = __half2;
  __device__ static __forceinline__ float ToFloat(__half v) { return __half2float(v); }
  __device__ static __forceinline__ __half FromFloat(float v) { return __float2half_rn(v); }
  __device__ static __forceinline__ __half2 Low(__half2 v) { return __low2half2(v); }
  __device__ static __forceinline__ __half2 High(__half2 v) { return __high2half2(v); }
  __device__ static __forceinline__ float2 ToFloat2(__half2 v) { return __half22float2(v); }
  __device__ static __forceinline__ __half2 Splat(__half v) { return __half2half2(v); }  // (v, v)
};

template <>
struct Act<__nv_bfloat16> {
  using T2 = __nv_bfloat162;
  __device__ static __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __forceinline__ __nv_bfloat16 FromFloat(float v) { return __float2bfloat16_rn(v); }
  __device__ static __forceinline__ __nv_bfloat162 Low(__nv_bfloat162 v) { return __low2bfloat162(v); }
  __device__ static __forceinline__ __nv_bfloat162 High(__nv_bfloat162 v) { return __high2bfloat162(v); }
  __device__ static __forceinline__ float2 ToFloat2(__nv_bfloat162 v) { return __bfloat1622float2(v); }
  __device__ static __forceinline__ __nv_bfloat162 Splat(__nv_bfloat16 v) { return __bfloat162bfloat162(v); }
};

template <typename T2>
__device__ __forceinline__ uint32_t AsU32(T2 v) {
  return *reinterpret_cast<uint32_t*>(&v);
}

template <typename T2>
__device__ __forceinline__ T2 FromU32(uint32_t v) {
  return *reinterpret_cast<T2*>(&v);
}

// Weights are read exactly once: bypass L1 so it keeps the activations, which every warp re-reads.
__device__ __forceinline__ uint4 LoadOnce16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// Data read once that the same kernel writes elsewhere (a cache row beside the one it updates):
// L1 skipped as above, but coherent (no .nc, whose data must not change while the kernel runs).
// Not ordered against the kernel's own stores: a caller must not use what it loads of a location
// being written.
__device__ __forceinline__ uint4 LoadStream16(const void* p) {
  uint4 v;
  asm("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// cp.async: global -> shared without registers (SM80+). CpAsync16 bypasses L1 (.cg, which takes
// only 16 bytes); CpAsyncCa goes through it (.ca: 4, 8 or 16 bytes), for pieces under 16 bytes
// and for data other warps of the SM read too (x). Groups are committed and waited on per thread.
// CpAsync16Shared takes the destination as a shared-space address (__cvta_generic_to_shared), for
// loops that keep their copies' destinations from one window to the next.
__device__ __forceinline__ void CpAsync16Shared(uint32_t smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem), "l"(gmem) : "memory");
}
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem) {
  CpAsync16Shared(static_cast<uint32_t>(__cvta_generic_to_shared(smem)), gmem);
}
template <int BYTES>
__device__ __forceinline__ void CpAsyncCa(void* smem, const void* gmem) {
  static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async copies 4, 8 or 16 bytes");
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(s), "l"(gmem), "n"(BYTES) : "memory");
}

__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Activations are re-read by every warp of the grid: keep them in L1. kInPlace: the load stays
// where it is issued (volatile), for loads issued ahead of their use on purpose; otherwise the
// compiler may move it toward its use.
template <bool kInPlace = false>
__device__ __forceinline__ uint4 LoadKeep16(const void* p) {
#define JAXGEMV_LOAD_KEEP16(VOLATILE)                                                 \
  asm VOLATILE("ld.global.nc.L1::evict_last.v4.u32 {%0, %1, %2, %3}, [%4];" \
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)                          \
               : "l"(p))
  uint4 v;
  if constexpr (kInPlace) {
    JAXGEMV_LOAD_KEEP16(volatile);
  } else {
    JAXGEMV_LOAD_KEEP16();
  }
#undef JAXGEMV_LOAD_KEEP16
  return v;
}

__device__ __forceinline__ float LoadKeepF32(const float* p) {
  float v;
  asm("ld.global.nc.L1::evict_last.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}

// Brings the line holding p into L1 without waiting for it or holding a register: for values a
// kernel needs only at its end.
__device__ __forceinline__ void PrefetchL1(const void* p) { asm volatile("prefetch.global.L1 [%0];" ::"l"(p)); }
// The same into L2 only: L2 is where every SM's view of global memory meets, so a line brought
// there before another kernel's writes to it still reads as written (so a kernel may send lines
// there before its GridDependencyWait).
__device__ __forceinline__ void PrefetchL2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// Programmatic dependent launch (sm_90; no-ops before, and for a kernel launched without the
// programmatic-serialization attribute). A kernel launched with it may start while the kernel
// before it in the stream is still running; GridDependencyWait holds it until that kernel has
// completed and its writes are visible, so nothing the kernel reads may be read before the wait.
// LaunchDependents tells the hardware that the next kernel may begin launching once every block
// of this one has said so or exited.
__device__ __forceinline__ void GridDependencyWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void LaunchDependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// A load kept in program order after the copies before it (volatile), its use where the source puts it.
__device__ __forceinline__ float LoadLateF32(const float* p) {
  float v;
  asm volatile("ld.global.nc.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}

__device__ __forceinline__ uint2 LoadOnce8(const void* p) {
  uint2 v;
  asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

// Shift by a compile-time amount that may be negative (a right shift).
template <int S>
__device__ __forceinline__ uint32_t ShiftBy(uint32_t v) {
  if constexpr (S >= 0) {
    return v << S;
  } else {
    return v >> (-S);
  }
}

// D += A * B on the tensor cores, m16n8k16, fp32 accumulate. A is 16x16 row-major in four
// registers of two elements, B is 16x8 column-major in two (PTX ISA, "Matrix Fragments for
// mma.m16n8k16 with floating point type"): lane (g = lane / 4, t = lane % 4) holds
//   a0: A[g][2t, 2t+1]    a1: A[g+8][2t, 2t+1]    a2: A[g][2t+8, 2t+9]    a3: A[g+8][2t+8, 2t+9]
//   b0: B[2t, 2t+1][g]    b1: B[2t+8, 2t+9][g]
//   d0: D[g][2t]  d1: D[g][2t+1]  d2: D[g+8][2t]  d3: D[g+8][2t+1]
template <typename T>
__device__ __forceinline__ void Mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// The integer tensor cores (ffi/imma.cuh, tools/imma_probe.cu). A word of eight 4-bit codes (two
// a byte, low nibble first) as the signed bytes 16 (q - 8): codes 8t + {0, 2, 4, 6} (even) and
// 8t + {1, 3, 5, 7} (odd) of word t, one LOP3 each (a nibble in a byte's high half with its top bit
// flipped is its own sign extension).
__device__ __forceinline__ uint32_t ImmaEven4(uint32_t word) {
  uint32_t r;
  asm("lop3.b32 %0, %1, 0x88888888, 0xf0f0f0f0, 0x28;" : "=r"(r) : "r"(word << 4));  // (a ^ b) & c
  return r;
}
__device__ __forceinline__ uint32_t ImmaOdd4(uint32_t word) {
  uint32_t r;
  asm("lop3.b32 %0, %1, 0x88888888, 0xf0f0f0f0, 0x28;" : "=r"(r) : "r"(word));
  return r;
}

// ldmatrix.x4: four 8 x 8 matrices of 16-bit elements from shared memory (`saddr`, a shared-space
// address: lanes 8 i .. 8 i + 7 give matrix i's eight row addresses); r[i] is this lane's word of
// matrix i (row lane / 4, word lane % 4).
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], uint32_t saddr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(saddr));
}

// d = A B + c, m16n8k32 with signed bytes and int32 sums: lane (g, t) holds words t of rows g and
// g + 8 of A's first 16 bytes (a0, a1) and of its last 16 (a2, a3), and words t of column g of
// B's first and last 16 bytes (b.x, b.y).
__device__ __forceinline__ void Imma16832(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint2 b,
                                          const int (&c)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %11, %12, %13};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b.x), "r"(b.y), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]));
}

// Calls f(std::integral_constant<int, V>{}) for the V in Vs equal to v; false if none is.
// Turns a runtime launch parameter into a template parameter over a short whitelist.
template <int... Vs, typename F>
bool Switch(int64_t v, F&& f) {
  return ((v == Vs ? (f(std::integral_constant<int, Vs>{}), true) : false) || ...);
}

// f(std::integral_constant<int, 0>{}), ..., f(std::integral_constant<int, N - 1>{}): an unrolled
// loop whose index is a compile-time constant in the body.
template <typename F, int... Is>
__device__ __forceinline__ void StaticForImpl(F&& f, std::integer_sequence<int, Is...>) {
  (f(std::integral_constant<int, Is>{}), ...);
}

template <int N, typename F>
__device__ __forceinline__ void StaticFor(F&& f) {
  StaticForImpl(f, std::make_integer_sequence<int, N>{});
}

}  // namespace jaxgemv
