// The CUDA handlers that ffi/layer.cu launches one after another inside one call of its own (their
// definitions: ffi/fp4.cu, ffi/attention.cu; their arguments as the handlers bind them).
#pragma once

#include <cuda_runtime.h>

#include "xla/ffi/api/ffi.h"

namespace jaxgemv {
namespace ffi = xla::ffi;

ffi::Error Fp4MatmulCuda(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer packed,
                         ffi::AnyBuffer scales, ffi::AnyBuffer gscale, ffi::AnyBuffer bias,
                         ffi::AnyBuffer row_scale, ffi::AnyBuffer residual, ffi::Result<ffi::AnyBuffer> y,
                         int64_t variant, int64_t rows, int64_t ksplit, int64_t loads, int64_t xperm,
                         int64_t xs_warps, int64_t x_stage, float rms_eps, float rms_inv_k, int64_t activation);

ffi::Error DecodeAttentionCuda(cudaStream_t stream, int32_t device, ffi::AnyBuffer qkv, ffi::AnyBuffer k_cache,
                               ffi::AnyBuffer v_cache, ffi::AnyBuffer pos, ffi::Result<ffi::AnyBuffer> o,
                               ffi::Result<ffi::AnyBuffer> k_out, ffi::Result<ffi::AnyBuffer> v_out, int64_t heads,
                               int64_t kv_heads, float rope_theta, float scale, int64_t splits);
}  // namespace jaxgemv
