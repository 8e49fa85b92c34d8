// Thread-block clusters (sm_90): the barrier halves, a store into rank 0's shared memory, the
// block's rank, and a launch with a cluster dimension. Shared by the dense split-K kernel
// (ffi/dense.cu) and decode attention (ffi/attention.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "common.h"

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

// A one-digit diagnostic from the environment: its digit, or `unset` where it is missing or not a
// single digit (jaxgemv's planner rejects such values at trace time: check_launch_knobs).
inline int EnvDigit(const char* name, int unset) {
  const char* v = std::getenv(name);
  return v && v[0] >= '0' && v[0] <= '9' && v[1] == '\0' ? v[0] - '0' : unset;
}

// JAXGEMV_PDL, a diagnostic (docs/perf-log.md, entry 91): 1 launches the kernels that wait for
// their inputs with GridDependencyWait (the tensor-core GEMV, decode attention) with programmatic
// dependent launch, so that each may start while the kernel before it finishes; 2 as 1, and the
// GEMV sends its first windows' weight rows to L2 before it waits. Read once per process;
// jaxgemv's planner rejects other values at trace time.
inline int PdlMode() {
  static const int mode = [] {
    const int d = EnvDigit("JAXGEMV_PDL", 0);
    return d == 1 || d == 2 ? d : 0;
  }();
  return mode;
}

// JAXGEMV_EARLY=0, a diagnostic for A/B runs: the kernels read nothing before GridDependencyWait
// (GemvArgs::early_weights, the attention's early_rows). Read once per process; jaxgemv's planner
// rejects values other than 0 and 1 at trace time.
inline bool EarlyReadsAllowed() {
  static const bool allowed = EnvDigit("JAXGEMV_EARLY", 1) != 0;
  return allowed;
}

// Programmatic dependent launch for every launch this thread makes while a PdlScope lives: one
// handler that launches several dependent kernels (ffi/layer.cu) turns it on around them, so that
// XLA's capture of that handler joins them by programmatic edges. Every kernel launched with it
// must call GridDependencyWait before it reads or writes global memory.
inline bool& PdlScopeFlag() {
  static thread_local bool on = false;
  return on;
}
class PdlScope {
 public:
  PdlScope() : previous_(PdlScopeFlag()) { PdlScopeFlag() = true; }
  ~PdlScope() { PdlScopeFlag() = previous_; }
  PdlScope(const PdlScope&) = delete;
  PdlScope& operator=(const PdlScope&) = delete;

 private:
  bool previous_;
};
// Where the kernels launched while a TriggerScope lives let the next kernel launch: at their start
// (on) instead of once their weight or cache stream is done (off). Either way the
// next kernel's GridDependencyWait holds it until this one has completed and its writes are
// visible, so the choice moves only when the next kernel's blocks become resident and issue their
// early reads: at the start they can take the SM room this kernel leaves and have their first
// windows in flight, or landed, by the time this one ends (docs/perf-log.md, entry 97). A kernel
// so launched never delays this one's own blocks: the hardware launches it only once every block
// of this one has started. decoder_layer's call (ffi/layer.cu) opens one around each of its five
// launches whose bit its `trigger` mask sets (all but gate_up's by default; JAXGEMV_TRIGGER, read
// at trace time by jaxgemv/layer.py, picks others).
inline bool& TriggerScopeFlag() {
  static thread_local bool on = false;
  return on;
}
class TriggerScope {
 public:
  explicit TriggerScope(bool on) : previous_(TriggerScopeFlag()) { TriggerScopeFlag() = on; }
  ~TriggerScope() { TriggerScopeFlag() = previous_; }
  TriggerScope(const TriggerScope&) = delete;
  TriggerScope& operator=(const TriggerScope&) = delete;

 private:
  bool previous_;
};
inline bool EarlyTrigger() { return TriggerScopeFlag(); }

// Whether a kernel that waits with GridDependencyWait is launched with the attribute.
inline bool PdlLaunch() { return PdlMode() > 0 || PdlScopeFlag(); }
// Whether a kernel launched now may read its weights (a GEMV) or what only earlier steps wrote (the
// attention's cache rows and pos) before GridDependencyWait: where it is launched without the
// attribute (it starts after the kernel before it ends), or inside a PdlScope, whose handler
// launches after each of its kernels one that reads nothing the kernel before writes but its
// activations (ffi/layer.cu). Not under the JAXGEMV_PDL diagnostic outside a scope, where the
// kernel before may be anything.
inline bool EarlyReads() { return EarlyReadsAllowed() && (PdlScopeFlag() || !PdlLaunch()); }

// kernel<<<blocks, threads, smem, stream>>>(args...) in clusters of `cluster` consecutive blocks
// (1: no cluster attribute), with programmatic dependent launch where `pdl` says (the kernel must
// call GridDependencyWait before it reads anything). Clusters above 8 blocks are not portable and
// are allowed per kernel first (a function attribute: no stream operation).
template <typename... Params, typename... Args>
cudaError_t LaunchClustered(void (*kernel)(Params...), int cluster, unsigned blocks, unsigned threads, size_t smem,
                            cudaStream_t stream, bool pdl, Args&&... args) {
  if (cluster > 8) {
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (err != cudaSuccess) return err;
  }
  cudaLaunchAttribute attr[2];
  int n = 0;
  if (cluster > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = static_cast<unsigned>(cluster);
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = n > 0 ? attr : nullptr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<Args&&>(args)...);
}

// The handlers' check of the device before a kernel that needs sm_90 (clusters, or the sm_90a
// wgmma code, which runs on 9.0 alone: `exact`): an error naming `what` needs it, with the
// device's compute capability, or Internal where it cannot be read.
inline ffi::Error RequireSm90(int32_t device, bool exact, const std::string& what) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess)
    return ffi::Error::Internal("jaxgemv: " + what + ": cannot read the device's compute capability: " +
                                cudaGetErrorString(cudaGetLastError()));
  if (major < 9 || (exact && (major != 9 || minor != 0)))
    return Invalid(what + " needs a compute capability 9.0 device" + (exact ? "" : " or newer") + ", this one is " +
                   std::to_string(major) + "." + std::to_string(minor));
  return ffi::Error::Success();
}

}  // namespace jaxgemv
