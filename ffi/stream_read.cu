// The streaming-read ceiling: read S bytes once with 16-byte loads, as fast as the GPU allows.
// The benchmark times it inside the same jitted executables as the GEMVs, so "% of ceiling" is a
// like-for-like ratio (launch, graph replay and cold-L2 effects included on both sides).

#include <cuda_runtime.h>

#include <string>

#include "common.h"
#include "handlers.h"
#include "stream_read.cuh"

namespace jaxgemv {
namespace {

ffi::Error StreamReadCuda(cudaStream_t stream, int32_t device, ffi::AnyBuffer data,
                          ffi::AnyBuffer salt, ffi::Result<ffi::AnyBuffer> out) {
  if (data.element_type() != ffi::DataType::U8 || data.element_count() % 16 != 0)
    return Invalid("stream_read: data must be uint8 with a size divisible by 16");
  // Any array of 4 bytes or more: its first 4 bytes are the salt. The benchmark's ceiling passes
  // the product's x itself, so that the salt costs no kernel of its own (jaxgemv/bench.py).
  if (salt.size_bytes() < 4) return Invalid("stream_read: salt must hold at least 4 bytes");
  if (out->element_type() != ffi::DataType::U32 || out->element_count() != 1)
    return Invalid("stream_read: out must be one uint32");
  // The grid is sized for the device XLA runs this call on (a process may hold different GPUs).
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms <= 0)
    return ffi::Error::Internal("jaxgemv: stream_read: cannot read the device's multiprocessor count");
  StreamReadKernel<<<kReadBlocksPerSm * sms, kReadThreads, 0, stream>>>(
      static_cast<const uint4*>(data.untyped_data()), data.element_count() / 16,
      static_cast<const uint32_t*>(salt.untyped_data()), static_cast<uint32_t*>(out->untyped_data()));
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
