// The extension module: one registrations() dict of {platform: {target name: handler}}, which
// jaxgemv/_ext.py registers with XLA, plus the constants Python reads from C++.

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <type_traits>

#include "common.h"
#include "handlers.h"

namespace nb = nanobind;

namespace {

template <typename T>
nb::capsule Capsule(T* fn) {
  static_assert(std::is_invocable_r_v<XLA_FFI_Error*, T, XLA_FFI_CallFrame*>, "not an XLA FFI handler");
  return nb::capsule(reinterpret_cast<void*>(fn));
}

}  // namespace

NB_MODULE(_jaxgemv, m) {
  m.def("registrations", []() {
    nb::dict cpu;
    cpu["jaxgemv_fp4_matmul"] = Capsule(JaxgemvFp4MatmulCpu);
    cpu["jaxgemv_fp4_dequantize"] = Capsule(JaxgemvFp4DequantizeCpu);
    cpu["jaxgemv_fp8_matmul"] = Capsule(JaxgemvFp8MatmulCpu);
    cpu["jaxgemv_nbits_matmul"] = Capsule(JaxgemvNbitsMatmulCpu);
    cpu["jaxgemv_dense_matmul"] = Capsule(JaxgemvDenseMatmulCpu);
    cpu["jaxgemv_decode_attention"] = Capsule(JaxgemvDecodeAttentionCpu);
    nb::dict out;
    out["cpu"] = cpu;
#ifdef JAXGEMV_WITH_CUDA
    nb::dict cuda;
    cuda["jaxgemv_fp4_matmul"] = Capsule(JaxgemvFp4MatmulCuda);
    cuda["jaxgemv_fp4_dequantize"] = Capsule(JaxgemvFp4DequantizeCuda);
    cuda["jaxgemv_fp8_matmul"] = Capsule(JaxgemvFp8MatmulCuda);
    cuda["jaxgemv_fp8_wgmma"] = Capsule(JaxgemvFp8WgmmaCuda);
    cuda["jaxgemv_nbits_matmul"] = Capsule(JaxgemvNbitsMatmulCuda);
    cuda["jaxgemv_nbits_imma"] = Capsule(JaxgemvNbitsImmaCuda);
    cuda["jaxgemv_nbits_xshare"] = Capsule(JaxgemvNbitsXshareCuda);
    cuda["jaxgemv_dense_matmul"] = Capsule(JaxgemvDenseMatmulCuda);
    cuda["jaxgemv_stream_read"] = Capsule(JaxgemvStreamReadCuda);
    cuda["jaxgemv_decode_attention"] = Capsule(JaxgemvDecodeAttentionCuda);
    cuda["jaxgemv_fp4_layer"] = Capsule(JaxgemvFp4LayerCuda);
    out["CUDA"] = cuda;
#endif
    return out;
  });
  // The tensor-core formats by the names jaxgemv gives them (ValueError for any other).
  const auto mma_format = [](const std::string& format) {
    if (format == "nvfp4") return jaxgemv::MmaFormat::kNvfp4;
    if (format == "fp8") return jaxgemv::MmaFormat::kFp8;
    if (format == "int4") return jaxgemv::MmaFormat::kInt4;
    if (format == "int8") return jaxgemv::MmaFormat::kInt8;
    throw nb::value_error(("format must be nvfp4, fp8, int4 or int8, got '" + format + "'").c_str());
  };
  m.def("has_cuda", []() {
#ifdef JAXGEMV_WITH_CUDA
    return true;
#else
    return false;
#endif
  });
#ifdef JAXGEMV_WITH_CUDA
  m.def("attention_smem_bytes", &jaxgemv::DecodeAttentionSmemBytes);
  // The K split of the imma variant's launcher (ffi/imma.cu) for a product, 0 where it does not run.
  m.def("imma_ksplit", &jaxgemv::ImmaKSplitChoice, nb::arg("bits"), nb::arg("bf16"), nb::arg("m"), nb::arg("n"),
        nb::arg("k"), nb::arg("block_size"), nb::arg("loads"), nb::arg("device"));
  // Bytes of the xshare variant's scratch result (ffi/xshare.cuh: XshareScratchBytes), which
  // jaxgemv/nbits.py mirrors.
  m.def("xshare_scratch_bytes", &jaxgemv::XshareScratchBytesOf, nb::arg("m"), nb::arg("n"), nb::arg("bits"));
  // The wgmma variant's scratch bytes and K split (ffi/fp8_wgmma.cu), which jaxgemv/fp8.py and the
  // benchmark's labels mirror.
  m.def("fp8_wgmma_scratch_bytes", &jaxgemv::Fp8WgmmaScratchBytes, nb::arg("m"), nb::arg("n"), nb::arg("k"),
        nb::arg("ksplit"));
  m.def("fp8_wgmma_ksplit", &jaxgemv::Fp8WgmmaKSplit, nb::arg("k"), nb::arg("ksplit"));
  // What the per-block tensor-core launcher would run for a product and plan on a device
  // (common.h: MmaLaunchChoice): (ksplit, held, x_staged, x_ahead), or None where it has no answer.
  m.def(
      "mma_launch_choice",
      [=](const std::string& format, bool f16, int64_t m, int64_t n, int64_t k, int64_t rows, int64_t ksplit,
          int64_t loads, int64_t xperm, int64_t xs_warps, int64_t x_stage, int64_t block_size, int device) -> nb::object {
        const jaxgemv::MmaLaunchQuery q{device, f16, m, n, k, block_size, rows, ksplit, loads, xperm, xs_warps, x_stage};
        jaxgemv::MmaLaunchChoice c;
        switch (mma_format(format)) {
          case jaxgemv::MmaFormat::kNvfp4: c = jaxgemv::Nvfp4MmaLaunchChoice(q); break;
          case jaxgemv::MmaFormat::kFp8: c = jaxgemv::Fp8MmaLaunchChoice(q); break;
          case jaxgemv::MmaFormat::kInt4: c = jaxgemv::NbitsMmaLaunchChoice(4, q); break;
          case jaxgemv::MmaFormat::kInt8: c = jaxgemv::NbitsMmaLaunchChoice(8, q); break;
        }
        if (c.ksplit == 0) return nb::none();
        return nb::make_tuple(c.ksplit, c.held, c.x_staged, c.x_ahead);
      },
      nb::arg("format"), nb::arg("f16"), nb::arg("m"), nb::arg("n"), nb::arg("k"), nb::arg("rows"), nb::arg("ksplit"),
      nb::arg("loads"), nb::arg("xperm"), nb::arg("xs_warps") = 0, nb::arg("x_stage") = -1, nb::arg("block_size") = 0,
      nb::arg("device") = 0);
#endif
  // The per-block kernel's residency pin (common.h), for jaxgemv's planner to report and test.
  m.def("mma_has_bounded_instance", &jaxgemv::MmaHasBoundedInstance, nb::arg("rows"), nb::arg("ksplit"),
        nb::arg("xperm"));
  m.def("takes_bounded_instance", &jaxgemv::TakesBoundedInstance, nb::arg("blocks"), nb::arg("sms"),
        nb::arg("free_per_sm"), nb::arg("bounded_per_sm"));
  m.def("mma_bounded_blocks", [](int64_t rows) { return jaxgemv::MmaBoundedBlocks(rows); }, nb::arg("rows") = 1);
  // The launcher's wave rules (common.h), for jaxgemv's tests and tools/waves.py.
  m.def("past_one_wave_by_a_quarter", &jaxgemv::PastOneWaveByAQuarter, nb::arg("blocks"), nb::arg("sms"),
        nb::arg("per_sm"));
  m.def(
      "ksplit8_past_one_wave", [=](const std::string& format) { return jaxgemv::MmaKSplit8PastOneWave(mma_format(format)); },
      nb::arg("format"));
  m.def(
      "halves_ksplit",
      [=](const std::string& format, int rows, int ksplit) {
        return jaxgemv::MmaHalvesKSplit(mma_format(format), rows, ksplit);
      },
      nb::arg("format"), nb::arg("rows"), nb::arg("ksplit"));
  m.def(
      "takes_half_ksplit",
      [=](const std::string& format, bool f16, int rows, int ksplit, int64_t k, int64_t blocks, int64_t sms,
          int64_t per_sm, bool held, int64_t per_sm_half) {
        return jaxgemv::TakesHalfKSplitRule(mma_format(format), f16, rows, ksplit, k, blocks, sms, per_sm, held,
                                            per_sm_half);
      },
      nb::arg("format"), nb::arg("f16"), nb::arg("rows"), nb::arg("ksplit"), nb::arg("k"), nb::arg("blocks"), nb::arg("sms"),
      nb::arg("per_sm"), nb::arg("held"), nb::arg("per_sm_half"));
  m.def(
      "doubles_ksplit",
      [=](const std::string& format, int rows, int ksplit) {
        return jaxgemv::MmaDoublesKSplit(mma_format(format), rows, ksplit);
      },
      nb::arg("format"), nb::arg("rows"), nb::arg("ksplit"));
  m.def("takes_double_ksplit", &jaxgemv::TakesDoubleKSplitRule, nb::arg("blocks"), nb::arg("sms"), nb::arg("per_sm"),
        nb::arg("per_sm_twice"));
  m.def(
      "x_ahead_format", [=](const std::string& format) { return jaxgemv::MmaXAheadFormat(mma_format(format)); },
      nb::arg("format"));
  m.def("takes_x_ahead", &jaxgemv::TakesXAheadRule, nb::arg("blocks"), nb::arg("sms"), nb::arg("ksplit"),
        nb::arg("per_sm"), nb::arg("per_sm_xa"));
  m.def(
      "ksplit6", [=](const std::string& format, bool one_row) { return jaxgemv::MmaKSplit6(mma_format(format), one_row); },
      nb::arg("format"), nb::arg("one_row"));
  m.def(
      "takes_ksplit6",
      [=](const std::string& format, int64_t m, bool xperm, bool held, bool x_forced, int64_t blocks, int64_t sms,
          int64_t per_sm8, int64_t per_sm6) {
        return jaxgemv::TakesKSplit6Rule(mma_format(format), m, xperm, held, x_forced, blocks, sms, per_sm8, per_sm6);
      },
      nb::arg("format"), nb::arg("m"), nb::arg("xperm"), nb::arg("held"), nb::arg("x_forced"), nb::arg("blocks"),
      nb::arg("sms"), nb::arg("per_sm8"), nb::arg("per_sm6"));
  m.def("variant_codes", []() {
    nb::dict codes;
    for (const auto& [name, code] : jaxgemv::kVariantCodes) codes[name] = code;
    return codes;
  });
}
