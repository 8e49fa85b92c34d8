// Every FFI handler symbol of the extension; ffi/jaxgemv.cc registers them by target name.
#pragma once

#include "common.h"
#include "xla/ffi/api/ffi.h"

// CPU (ffi/fp4_cpu.cc, ffi/fp8_cpu.cc, ffi/nbits_cpu.cc, ffi/dense_cpu.cc, ffi/attention_cpu.cc)
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxgemvFp4MatmulCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxgemvFp4DequantizeCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxgemvFp8MatmulCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxgemvNbitsMatmulCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxgemvDenseMatmulCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxgemvDecodeAttentionCpu);

#ifdef JAXGEMV_WITH_CUDA
// CUDA (ffi/fp4.cu, ffi/fp8.cu, ffi/nbits.cu, ffi/dense.cu, ffi/stream_read.cu, ffi/attention.cu)
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxgemvFp4MatmulCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxgemvFp8MatmulCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxgemvFp8WgmmaCuda);  // ffi/fp8_wgmma.cu (sm_90a)
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxgemvNbitsMatmulCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxgemvNbitsImmaCuda);  // ffi/imma.cu
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxgemvNbitsXshareCuda);  // ffi/xshare.cu
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxgemvDenseMatmulCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxgemvFp4DequantizeCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxgemvStreamReadCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxgemvDecodeAttentionCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxgemvFp4LayerCuda);  // ffi/layer.cu

namespace jaxgemv {
// Shared memory of one block of the decode attention kernel at these parameters (ffi/attention.cu:
// AttentionSmemBytes), or -1 where the kernel has no such instance: the planner's Python mirror
// (jaxgemv/attention.py: attention_smem_bytes) is tested against it.
int64_t DecodeAttentionSmemBytes(int64_t head_dim, int64_t g, int64_t splits);
// What the per-block tensor-core launcher would run (common.h: MmaLaunchChoice), per format:
// ffi/fp4.cu, ffi/fp8.cu, ffi/nbits.cu (bits 4 or 8).
MmaLaunchChoice Nvfp4MmaLaunchChoice(const MmaLaunchQuery& q);
MmaLaunchChoice Fp8MmaLaunchChoice(const MmaLaunchQuery& q);
MmaLaunchChoice NbitsMmaLaunchChoice(int64_t bits, const MmaLaunchQuery& q);
// The K split the imma launcher picks for a symmetric product (ffi/imma.cu: ImmaKSplit) on a
// device, 0 where the kernel does not take it.
int ImmaKSplitChoice(int64_t bits, bool bf16, int64_t m, int64_t n, int64_t k, int64_t block_size, int64_t loads,
                     int device);
// Bytes of the xshare variant's scratch result for M rows, N columns and BITS-bit codes (ffi/xshare.cu).
int64_t XshareScratchBytesOf(int64_t m, int64_t n, int64_t bits);
// Bytes of the wgmma variant's scratch result for M rows, N, K and the plan's K split
// (ffi/fp8_wgmma.cuh: WgScratchBytes), and the K split its launcher takes for K where the plan says
// `ksplit` (0: its choice).
int64_t Fp8WgmmaScratchBytes(int64_t m, int64_t n, int64_t k, int64_t ksplit);
int Fp8WgmmaKSplit(int64_t k, int64_t ksplit);
}  // namespace jaxgemv
#endif
