// Thread-block clusters (sm_90): the barrier halves, a store into rank 0's shared memory, the
// block's rank, and a launch with a cluster dimension. Shared by the dense split-K kernel
// (ffi/dense.cu) and decode attention (ffi/attention.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace jaxgemv {

// Launchers refuse clusters on devices older than sm_90 (and the cluster attention kernel checks
// that it was built with sm_90 code), so kernels compiled for older architectures never reach
// these; there they trap rather than assemble instructions the architecture lacks.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define JAXGEMV_SM90_ASM(...) __trap()
#else
#define JAXGEMV_SM90_ASM(...) asm volatile(__VA_ARGS__)
#endif

// Barrier halves (PTX ISA: barrier.cluster). Every thread arrives once and waits once per phase;
// .aligned: the whole warp executes each one together (outside divergent code, or after a
// __syncwarp).
__device__ __forceinline__ void ClusterArriveRelaxed() {
  JAXGEMV_SM90_ASM("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void ClusterArriveRelease() {
  JAXGEMV_SM90_ASM("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void ClusterWait() { JAXGEMV_SM90_ASM("barrier.cluster.wait.aligned;" ::: "memory"); }
__device__ __forceinline__ void ClusterWaitAcquire() {
  JAXGEMV_SM90_ASM("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// This block's rank in its cluster and the cluster's size.
__device__ __forceinline__ void ClusterRank(int* rank, int* size) {
  JAXGEMV_SM90_ASM("mov.u32 %0, %%cluster_ctarank;\n\tmov.u32 %1, %%cluster_nctarank;" : "=r"(*rank), "=r"(*size));
}
// *p in the shared memory of the cluster's block of rank 0 (p: the same variable in this block).
__device__ __forceinline__ void StoreToRank0(float* p, float v) {
  const uint32_t local = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  JAXGEMV_SM90_ASM("{\n\t.reg .b32 r;\n\tmapa.shared::cluster.u32 r, %0, 0;\n\tst.shared::cluster.f32 [r], %1;\n\t}"
                   ::"r"(local), "f"(v) : "memory");
}
#undef JAXGEMV_SM90_ASM

// kernel<<<blocks, threads, smem, stream>>>(args...) in clusters of `cluster` consecutive blocks
// (1: no cluster attribute). Clusters above 8 blocks are not portable and are allowed per kernel
// first (a function attribute: no stream operation).
template <typename... Params, typename... Args>
cudaError_t LaunchClustered(void (*kernel)(Params...), int cluster, unsigned blocks, unsigned threads, size_t smem,
                            cudaStream_t stream, Args&&... args) {
  if (cluster > 8) {
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (err != cudaSuccess) return err;
  }
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(cluster);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = cluster > 1 ? attr : nullptr;
  cfg.numAttrs = cluster > 1 ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<Args&&>(args)...);
}

}  // namespace jaxgemv
