// Dense fp16/bf16 products with a small N on Hopper: y = x @ w^T (+ bias), x [M <= 8, K], w [N, K]
// row-major, float32 accumulation, output in x's type (jaxgemv/dense.py; the planner sends wider
// products to XLA's dot).
//
// Why the seed (ONNX Runtime's split-K GEMV, 10.6 us against cuBLAS's 5.0 on cold weights) lost,
// and what this kernel does instead:
//  - Its blocks published fp32 partials to a global workspace, fenced, bumped a counter, and the
//    last block to arrive re-read every partial: two extra memory round trips (the atomic and the
//    workspace reads, both at L2 latency) after the weight loads, plus a memset of the counters in
//    a separate launch. Here the blocks that share K form a thread-block cluster (sm_90) and the
//    partials meet in distributed shared memory after one cluster barrier: no workspace, no
//    counters, one launch, nothing to zero.
//  - Cold, a product of a few hundred KB is one DRAM latency (~1 us) if every byte is requested
//    at once, and several latencies if each thread waits for one load before issuing the next.
//    Here every lane issues all of its 16-byte weight loads of an iteration (2 x kLoads, up to
//    256 B per lane) before it uses the first, and the planner sizes splits and loads so that in
//    the seed's range (N <= 1024, K <= 4096) a warp's whole share of K is one iteration: the
//    entire weight is in flight at once.
//
// Layout. A cluster of kSplits blocks owns 16 output columns; its kSplits x 4 warps own equal,
// contiguous runs of K (in 16-byte chunks of 8 values). A warp multiplies its 16 weight rows by
// the <= 8 rows of x on the tensor cores, mma.m16n8k16 with the weight in the A slot (16 rows =
// 16 columns of y) and x in the B slot (8 columns = 8 rows of x, zero beyond M). The sum over k
// does not care which k a fragment position stands for, only that A and B agree, so each lane
// (g = lane / 4, t = lane % 4) loads 8 consecutive k of weight rows g and g + 8 and of x row g,
// and those 8 values fill the k-pairs (2t, 2t+1) and (2t+8, 2t+9) of two mmas (cuda_util.cuh has
// the fragment map). No shuffles or shared-memory staging of operands: registers straight from
// 16-byte global loads into the mma, and the accumulator fragment already holds distinct outputs.
//
// Determinism: the mapping from (shape, plan) to the K each warp sums is fixed, the warps'
// partials are added in warp order in shared memory, and the blocks' partials in rank order by
// rank 0 of the cluster. The same inputs give the same bits on every run.
//
// Command-buffer compatible: no synchronisation, no allocation, no host reads of device memory.

#include <cuda_runtime.h>

#include <string>

#include "cluster.cuh"
#include "common.h"
#include "cuda_util.cuh"
#include "handlers.h"

namespace jaxgemv {
namespace {

constexpr int kWarps = 4;                 // warps per block, all on the block's 16 columns
constexpr int kCols = 16;                 // columns per cluster: the A rows of one mma
constexpr int kRows = 8;                  // rows of x: the B columns of one mma
constexpr int kOuts = kCols * kRows;      // outputs per cluster
constexpr int kThreads = 32 * kWarps;
static_assert(kOuts == kThreads, "the reductions give each thread one output");
// Blocks per SM that the registers must allow. Without a minimum, ptxas kept the kernel at ~60
// registers by slotting each chunk's mmas between the loads, so a lane waited for one load
// before issuing the next; with it, all loads of an iteration are issued first (~120 registers:
// 4 blocks, 16 warps per SM, which the planner's grids do not exceed in the seed's range).
constexpr int kMinBlocks = 4;

struct DenseArgs {
  const void* x;     // [M, K]
  const void* w;     // [N, K]
  const void* bias;  // [N] or nullptr
  void* y;           // [M, N]
  int m, n;
  int64_t k;         // a multiple of 8 (16-byte rows)
  int64_t per_warp;  // chunks of 8 values per warp: ceil(K / 8 / (splits x kWarps)), from the host
};

// 16-byte loads that read as zeros where `ok` is false (rows past N or M, chunks past the warp's
// run): the predicate sits on the load itself, so no branch splits the batch of loads. Not
// volatile, so that the compiler may hoist them all ahead of the first mma that consumes one (it
// kept volatile loads in program order and slotted each chunk's mmas between them, which made
// every batch wait for one load after another). The weight is read once: no L1 allocation
// (kKeepInL1 false); x is re-read by every cluster: kept in L1 (kKeepInL1 true).
#define JAXGEMV_PREDICATED_LOAD16(HINT)                                                              \
  asm("{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n"  \
      " mov.b32 %3, 0;\n @p ld.global.nc." HINT ".v4.u32 {%0, %1, %2, %3}, [%4];\n}"                  \
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)                                                 \
      : "l"(p), "r"(static_cast<int>(ok)))
template <bool kKeepInL1>
__device__ __forceinline__ uint4 LoadPredicated16(const uint4* p, bool ok) {
  uint4 v;
  if constexpr (kKeepInL1) {
    JAXGEMV_PREDICATED_LOAD16("L1::evict_last");
  } else {
    JAXGEMV_PREDICATED_LOAD16("L1::no_allocate");
  }
  return v;
}
#undef JAXGEMV_PREDICATED_LOAD16

template <typename T>
__device__ __forceinline__ float LoadBias(const T* p) {
  uint16_t v;
  asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(v) : "l"(p));
  return Act<T>::ToFloat(*reinterpret_cast<const T*>(&v));
}

// kSplits blocks of a cluster share the K of 16 columns; kLoads 16-byte chunks per lane and weight
// row per iteration (a warp covers 4 x kLoads chunks, 32 x kLoads values of K, per iteration).
template <typename T, int kSplits, int kLoads>
__global__ void __launch_bounds__(kThreads, kMinBlocks) DenseSplitKKernel(DenseArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ float warp_part[kWarps][kOuts];     // [warp][m * 16 + column]
  __shared__ float cluster_part[kSplits][kOuts];  // rank 0's: [rank][m * 16 + column]
  if constexpr (kSplits > 1) ClusterArriveRelaxed();

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  // A 1-D cluster spans consecutive blockIdx.x, so the block's rank in it is blockIdx.x % kSplits.
  const int rank = static_cast<int>(blockIdx.x % kSplits);
  const int64_t n0 = static_cast<int64_t>(blockIdx.x / kSplits) * kCols;

  // This thread's output in the reductions: x row o / 16, column n0 + o % 16. Its bias is read
  // now, in the shadow of the weight loads, not after the barrier where it would add a latency.
  const int o = threadIdx.x;
  const int m = o / kCols;
  const int64_t n = n0 + o % kCols;
  const bool out_ok = m < a.m && n < a.n;
  const float bias = out_ok && a.bias && rank == 0 ? LoadBias(static_cast<const T*>(a.bias) + n) : 0.f;

  // Chunks of 8 values; the kSplits x kWarps warps of the cluster take equal contiguous runs.
  const int64_t chunks = a.k / 8;
  const int64_t c_begin = min(chunks, (static_cast<int64_t>(rank) * kWarps + warp) * a.per_warp);
  const int64_t c_end = min(chunks, c_begin + a.per_warp);

  // Rows past N and x rows past M read as zeros (their pointers are clamped, never dereferenced).
  const bool lo_ok = n0 + g < a.n, hi_ok = n0 + g + 8 < a.n, x_ok = g < a.m;
  const uint4* w_lo = static_cast<const uint4*>(a.w) + (lo_ok ? n0 + g : 0) * (a.k / 8);
  const uint4* w_hi = static_cast<const uint4*>(a.w) + (hi_ok ? n0 + g + 8 : 0) * (a.k / 8);
  const uint4* xr = static_cast<const uint4*>(a.x) + (x_ok ? g : 0) * (a.k / 8);

  // Two accumulators, one per mma of a chunk, halve the dependent chain of mmas; added at the end.
  float d0[4] = {0.f, 0.f, 0.f, 0.f}, d1[4] = {0.f, 0.f, 0.f, 0.f};
  for (int64_t c0 = c_begin; c0 < c_end; c0 += 4 * kLoads) {
    // Lane t takes chunks c0 + kLoads t .. + kLoads - 1: each weight row is read as 64 x kLoads
    // contiguous bytes by the 4 lanes of a quad. Every load of the iteration is issued before
    // the first mma waits on one.
    uint4 wl[kLoads], wh[kLoads], xv[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int64_t c = c0 + kLoads * t + u;
      const bool in = c < c_end;
      wl[u] = LoadPredicated16<false>(w_lo + c, in && lo_ok);
      wh[u] = LoadPredicated16<false>(w_hi + c, in && hi_ok);
      xv[u] = LoadPredicated16<true>(xr + c, in && x_ok);
    }
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      // k-pairs (0,1), (2,3) of the chunk as the mma's (2t, 2t+1), (2t+8, 2t+9); then (4,5), (6,7).
      Mma16816<T>(d0, wl[u].x, wh[u].x, wl[u].y, wh[u].y, xv[u].x, xv[u].y);
      Mma16816<T>(d1, wl[u].z, wh[u].z, wl[u].w, wh[u].w, xv[u].z, xv[u].w);
    }
  }

  // Accumulator fragment: d[0] = (column g, x row 2t), d[1] = (g, 2t + 1), d[2] = (g + 8, 2t),
  // d[3] = (g + 8, 2t + 1). Stored m-major so that the final stores of y run along N.
  float* part = warp_part[warp];
  part[(2 * t) * kCols + g] = d0[0] + d1[0];
  part[(2 * t + 1) * kCols + g] = d0[1] + d1[1];
  part[(2 * t) * kCols + g + 8] = d0[2] + d1[2];
  part[(2 * t + 1) * kCols + g + 8] = d0[3] + d1[3];
  __syncthreads();

  float sum = warp_part[0][o];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) sum += warp_part[w][o];

  if constexpr (kSplits > 1) {
    // Every block pushes its partials into rank 0's shared memory (st.shared::cluster), then the
    // cluster barrier: its arrive has release and its wait acquire semantics at cluster scope,
    // so rank 0 reads all of them locally after it. No global workspace, no counter, nothing to
    // zero between calls, one barrier on the path (its release is the one fence, a MEMBAR that
    // waits for the remote store only); rank 0 adds the partials in rank order.
    // Remote shared memory may only be written once its block is known to be running: the
    // first barrier phase says so. Its arrive is the kernel's first instruction and its wait
    // comes after the loads, so that phase completes while the weight is in flight.
    ClusterWait();
    StoreToRank0(&cluster_part[rank][o], sum);
    ClusterArriveRelease();
    ClusterWaitAcquire();
    if (rank != 0) return;  // nothing reads this block's shared memory: it may leave
    sum = cluster_part[0][o];
#pragma unroll
    for (int r = 1; r < kSplits; ++r) sum += cluster_part[r][o];
  }

  if (out_ok) static_cast<T*>(a.y)[m * static_cast<int64_t>(a.n) + n] = Act<T>::FromFloat(sum + bias);
#endif
}

template <typename T, int kSplits, int kLoads>
cudaError_t LaunchDense(cudaStream_t stream, const DenseArgs& a) {
  return LaunchClustered(DenseSplitKKernel<T, kSplits, kLoads>, kSplits,
                         static_cast<unsigned>((a.n + kCols - 1) / kCols * kSplits), kThreads, 0, stream, false, a);
}

ffi::Error DenseMatmulCuda(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer w,
                           ffi::AnyBuffer bias, ffi::Result<ffi::AnyBuffer> y, int64_t variant, int64_t splits,
                           int64_t loads) {
  if (static_cast<Variant>(variant) != Variant::kSplitK)
    return Invalid("dense_matmul on CUDA runs only the 'splitk' variant (the planner sends the rest to XLA)");
  ProductShape s;
  if (auto err = CheckDenseMatmul(x, w, bias, *y, &s); err.failure()) return err;
  if (s.m < 1 || s.m > kRows) return Invalid("the splitk kernel takes 1 to 8 rows of x");
  if (s.n < 1 || s.n >= (1 << 30)) return Invalid("the splitk kernel needs 1 <= N < 2^30");
  if (s.k < 8 || s.k % 8 != 0) return Invalid("the splitk kernel needs K % 8 == 0 (16-byte weight rows)");
  if (!Aligned16(x.untyped_data()) || !Aligned16(w.untyped_data()))
    return Invalid("x and w must be 16-byte aligned");
  // Per device, read on the host: clusters and distributed shared memory need sm_90.
  if (auto err = RequireSm90(device, false, "the splitk kernel (thread-block clusters)"); err.failure()) return err;

  const bool splits_ok = splits == 1 || splits == 2 || splits == 4 || splits == 8 || splits == 16;
  if (!splits_ok || !(loads == 1 || loads == 2 || loads == 4 || loads == 8))
    return Invalid("splitk plan: splits must be 1, 2, 4, 8 or 16, loads 1, 2, 4 or 8");

  const int64_t per_warp = (s.k / 8 + splits * kWarps - 1) / (splits * kWarps);
  const DenseArgs a{x.untyped_data(), w.untyped_data(), s.has_bias ? bias.untyped_data() : nullptr,
                    y->untyped_data(), static_cast<int>(s.m), static_cast<int>(s.n), s.k, per_warp};
  cudaError_t err = cudaSuccess;
  Switch<1, 2, 4, 8, 16>(splits, [&](auto sp) {
    Switch<1, 2, 4, 8>(loads, [&](auto ld) {
      constexpr int kS = decltype(sp)::value, kL = decltype(ld)::value;
      err = s.dtype == ffi::DataType::F16 ? LaunchDense<__half, kS, kL>(stream, a)
                                          : LaunchDense<__nv_bfloat16, kS, kL>(stream, a);
    });
  });
  if (err == cudaSuccess) err = cudaGetLastError();
  if (err != cudaSuccess)
    return ffi::Error::Internal(std::string("jaxgemv: launching DenseSplitKKernel: ") + cudaGetErrorString(err));
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxgemv

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemvDenseMatmulCuda, jaxgemv::DenseMatmulCuda,
                              jaxgemv::BindDenseMatmul(xla::ffi::Ffi::Bind()
                                                           .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()  // stream
                                                           .Ctx<xla::ffi::DeviceOrdinal>()),               // device
                              {xla::ffi::Traits::kCmdBufferCompatible});
