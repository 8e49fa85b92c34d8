"""Loads the compiled extension and registers its FFI targets with XLA.

The extension always carries the CPU handlers; it carries the CUDA handlers when a CUDA compiler
was found at build time. Registering a CUDA target on a jaxlib without a CUDA plugin is harmless:
XLA keeps the registration until a CUDA backend appears.
"""

from __future__ import annotations

import re

import jax

# The oldest jax whose whole CPU suite passes (0.7.0 and 0.7.1 fail the sharding tests; 0.6 has no
# jax.profiler.ProfileData); checked at 0.7.2, 0.8.3, 0.10.2 and 0.12.0.1 (and the GPU machine's
# 0.11.2). Refused here, before anything registers, with a message rather than an attribute error.
MIN_JAX = (0, 7, 2)
if tuple(int(p) for p in re.findall(r"\d+", jax.__version__)[:3]) < MIN_JAX:
    raise ImportError(f"jaxgemv needs jax {'.'.join(map(str, MIN_JAX))} or later; this is jax {jax.__version__}")

from jaxgemv import _jaxgemv  # noqa: E402  # type: ignore[attr-defined]

HAS_CUDA: bool = bool(_jaxgemv.has_cuda())

#: The decode attention kernel's shared memory per block, (head_dim, g, splits) -> bytes, from the
#: CUDA code itself (None in a build without CUDA); tests hold jaxgemv.attention's mirror to it.
ATTENTION_SMEM_BYTES = getattr(_jaxgemv, "attention_smem_bytes", None)

#: Kernel variant codes, defined once in ffi/common.h and read from there.
VARIANT_CODES: dict[str, int] = dict(_jaxgemv.variant_codes())

#: The per-block tensor-core kernel's residency pin, defined once in ffi/common.h: the blocks per
#: SM of its held instance (by m-tiles per block, 1 or 2), which kernels have one, and the
#: launcher's rule for taking it.
mma_bounded_blocks = _jaxgemv.mma_bounded_blocks
mma_has_bounded_instance = _jaxgemv.mma_has_bounded_instance
takes_bounded_instance = _jaxgemv.takes_bounded_instance
#: The launcher's window for FP8's K split 8 at M = 1 (ffi/common.h: PastOneWaveByAQuarter): more
#: blocks than one wave of the K-split-4 instance holds, at most a quarter of a wave more.
past_one_wave_by_a_quarter = _jaxgemv.past_one_wave_by_a_quarter
#: The launcher's per-format wave rules (ffi/common.h): whether a format takes K split 8 in place of 4
#: at M = 1 (MmaKSplit8PastOneWave), and which (rows, ksplit) launches it runs at half the split at
#: M > 1 where only the half holds the grid in one wave (MmaHalvesKSplit).
ksplit8_past_one_wave = _jaxgemv.ksplit8_past_one_wave
halves_ksplit = _jaxgemv.halves_ksplit
#: The half-split rule itself on blocks per SM (TakesHalfKSplitRule: format, f16 (x fp16, not bf16),
#: rows, ksplit, k, blocks, sms, per_sm of the planned instance unheld, held, per_sm_half of the
#: half): int8's two m-tiles with bf16 x judge it on the planned grid's last wave
#: (MmaHalvesOnLastWave, K up to 8192), ahead of the held instance.
takes_half_ksplit = _jaxgemv.takes_half_ksplit
#: Twice the planned K split at M 9-16 (MmaDoublesKSplit: format, rows, ksplit) and its rule on
#: blocks per SM (TakesDoubleKSplitRule: blocks, sms, per_sm, per_sm_twice).
doubles_ksplit = _jaxgemv.doubles_ksplit
takes_double_ksplit = _jaxgemv.takes_double_ksplit
#: The x-ahead instance at M = 2-8 (MmaXAheadFormat: format) and its rule (TakesXAheadRule: blocks,
#: sms, ksplit, per_sm of the planned instance, per_sm_xa of the x-ahead one).
x_ahead_format = _jaxgemv.x_ahead_format
takes_x_ahead = _jaxgemv.takes_x_ahead
#: K split 6 in place of K split 8 (ffi/common.h): whether a format takes it at M = 1 (one_row) or at
#: M = 2-8 (MmaKSplit6), and the launcher's rule on the two instances' blocks per SM
#: (TakesKSplit6Rule: format, m, xperm, held, x_forced, blocks, sms, per_sm8, per_sm6).
ksplit6 = _jaxgemv.ksplit6
takes_ksplit6 = _jaxgemv.takes_ksplit6

#: What the per-block tensor-core launcher would run for a product and plan on a CUDA device,
#: (ksplit, held, x_staged) after its own choices from the device's occupancy (K split 6 for K
#: split 8, the held instance, x staged at M = 1), or None where it has no answer (no device);
#: None itself in a build without CUDA. The benchmark labels its rows with it.
mma_launch_choice = getattr(_jaxgemv, "mma_launch_choice", None)
imma_ksplit = getattr(_jaxgemv, "imma_ksplit", None)  # ffi/imma.cu: ImmaKSplitChoice
#: Bytes of the xshare variant's scratch result (ffi/xshare.cu), which jaxgemv/nbits.py mirrors;
#: None in a build without CUDA.
xshare_scratch_bytes = getattr(_jaxgemv, "xshare_scratch_bytes", None)
#: The wgmma variant of FP8 (ffi/fp8_wgmma.cu): its scratch bytes, (m, n, k, ksplit) -> bytes, and
#: its launcher's K split, (k, ksplit) -> K split, which jaxgemv/fp8.py mirrors; None without CUDA.
fp8_wgmma_scratch_bytes = getattr(_jaxgemv, "fp8_wgmma_scratch_bytes", None)
fp8_wgmma_ksplit = getattr(_jaxgemv, "fp8_wgmma_ksplit", None)

for _platform, _targets in _jaxgemv.registrations().items():
    for _name, _capsule in _targets.items():
        jax.ffi.register_ffi_target(_name, _capsule, platform=_platform)
