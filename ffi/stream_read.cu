// The streaming-read ceiling: read S bytes once with 16-byte loads, as fast as the GPU allows.
// The benchmark times it inside the same jitted executables as the GEMVs, so "% of ceiling" is a
// like-for-like ratio (launch, graph replay and cold-L2 effects included on both sides).

#include <cuda_runtime.h>

#include <string>

#include "common.h"
#include "cuda_util.cuh"
#include "handlers.h"

namespace jaxgemv {
namespace {

// Eight loads in flight per thread in every round, the last round included (predicated, not a
// serial tail: with a grid this large, a read of a few tens of MB is one or two rounds per
// thread, and a serial tail adds a full memory latency per extra load. The 28 MB ceiling went
// from 26 to 10 us when this landed together with the benchmark's ordered passes, commit
// f10282b; the two were not measured apart). The XOR keeps the loads from being dropped and the (practically
// never taken) store keeps the XOR. `salt` makes repeated calls in one program distinct.
constexpr int kReadUnroll = 8;
__global__ void __launch_bounds__(512) StreamReadKernel(const uint4* p, int64_t n16, const uint32_t* salt,
                                                        uint32_t* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  uint32_t acc = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n16;
       i += kReadUnroll * stride) {
    uint4 v[kReadUnroll];
#pragma unroll
    for (int u = 0; u < kReadUnroll; ++u)
      v[u] = i + u * stride < n16 ? LoadOnce16(p + i + u * stride) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < kReadUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) out[0] = 0;
  if (acc == (0x9e3779b9u ^ __ldg(salt))) atomicOr(out, 1u);
}

ffi::Error StreamReadCuda(cudaStream_t stream, int32_t device, ffi::AnyBuffer data,
                          ffi::AnyBuffer salt, ffi::Result<ffi::AnyBuffer> out) {
  if (data.element_type() != ffi::DataType::U8 || data.element_count() % 16 != 0)
    return Invalid("stream_read: data must be uint8 with a size divisible by 16");
  if (salt.element_type() != ffi::DataType::U32 || salt.element_count() != 1)
    return Invalid("stream_read: salt must be one uint32");
  if (out->element_type() != ffi::DataType::U32 || out->element_count() != 1)
    return Invalid("stream_read: out must be one uint32");
  // The grid is sized for the device XLA runs this call on (a process may hold different GPUs).
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms <= 0)
    return ffi::Error::Internal("jaxgemv: stream_read: cannot read the device's multiprocessor count");
  StreamReadKernel<<<4 * sms, 512, 0, stream>>>(static_cast<const uint4*>(data.untyped_data()),
                                                data.element_count() / 16,
                                                static_cast<const uint32_t*>(salt.untyped_data()),
                                                static_cast<uint32_t*>(out->untyped_data()));
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return ffi::Error::Internal(std::string("jaxgemv: stream_read: ") + cudaGetErrorString(err));
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxgemv

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemvStreamReadCuda, jaxgemv::StreamReadCuda,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()  // stream
                                  .Ctx<xla::ffi::DeviceOrdinal>()                 // device
                                  .Arg<xla::ffi::AnyBuffer>()                     // data
                                  .Arg<xla::ffi::AnyBuffer>()                     // salt
                                  .Ret<xla::ffi::AnyBuffer>(),                    // out
                              {xla::ffi::Traits::kCmdBufferCompatible});
