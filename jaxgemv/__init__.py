"""jaxgemv: decode-time matrix products against quantized weights, for JAX.

    w = jaxgemv.quantize_nvfp4(w_bf16)        # or jaxgemv.NVFP4Weight(packed, scales, global_scale)
    y = jaxgemv.fp4_matmul(x, w, bias=b)      # x [..., K] fp16/bf16 -> y [..., N]

    w8 = jaxgemv.quantize_fp8(w_bf16, block=(1, 128))   # or jaxgemv.FP8Weight(data, scales, block)
    y = jaxgemv.fp8_matmul(x, w8)

    y = jaxgemv.dense_matmul(x, w_router)     # plain fp16/bf16 [N, K], small N (split-K on Hopper)
    y = jaxgemv.matmul(x, w)                  # any of these weights: the format's own product

    w = jax.device_put(w, jaxgemv.weight_sharding(w, mesh, P("tp", None)))   # every array, one spec

    w_gu = jaxgemv.quantize_nvfp4(jaxgemv.interleave_gate_up(w_gate, w_up))
    h = jaxgemv.fp4_matmul(x, w_gu, activation="swiglu")   # silu(x @ w_gate^T) * (x @ w_up^T)

    o, k_cache, v_cache = jaxgemv.decode_attention(qkv, k_cache, v_cache, pos, heads=32, kv_heads=8,
                                                   rope_theta=1e6)   # rope, cache write, attention
    y, k_cache, v_cache = jaxgemv.decoder_layer(x, w_qkv, w_o, w_gu, w_down, k_cache, v_cache, pos,
                                                heads=32, kv_heads=8, eps=1e-6, rope_theta=1e6)
"""

from jaxgemv import _ext
from jaxgemv._product import interleave_gate_up
from jaxgemv.attention import decode_attention, decode_attention_reference
from jaxgemv.dense import dense_matmul, dense_matmul_reference
from jaxgemv.device import DeviceFacts
from jaxgemv.fp4 import (
    NVFP4Weight,
    fp4_dequantize,
    fp4_matmul,
    fp4_matmul_reference,
    quantize_nvfp4,
)
from jaxgemv.fp8 import FP8Weight, fp8_matmul, fp8_matmul_reference, quantize_fp8
from jaxgemv.generic import matmul
from jaxgemv.layer import decoder_layer
from jaxgemv.nbits import NBitsWeight, int4_matmul, int8_matmul, quantize_int4, quantize_int8
from jaxgemv.planner import DensePlan, Plan, plan_dense, plan_fp4, plan_fp8, plan_nbits
from jaxgemv.sharding import weight_sharding

HAS_CUDA = _ext.HAS_CUDA

__all__ = [
    "DensePlan",
    "DeviceFacts",
    "FP8Weight",
    "HAS_CUDA",
    "NBitsWeight",
    "NVFP4Weight",
    "Plan",
    "decode_attention",
    "decode_attention_reference",
    "decoder_layer",
    "dense_matmul",
    "dense_matmul_reference",
    "fp4_dequantize",
    "fp4_matmul",
    "fp4_matmul_reference",
    "fp8_matmul",
    "fp8_matmul_reference",
    "int4_matmul",
    "int8_matmul",
    "interleave_gate_up",
    "matmul",
    "plan_dense",
    "plan_fp4",
    "plan_fp8",
    "plan_nbits",
    "quantize_fp8",
    "quantize_int4",
    "quantize_int8",
    "quantize_nvfp4",
    "weight_sharding",
]
