"""int4 / int8 checkpoints in GPTQ and AWQ layouts, repacked once into the MatMulNBits layout that
`int4_matmul` / `int8_matmul` read (`NBitsWeight.from_gptq`, `NBitsWeight.from_awq`).

Both store a linear layer's weight transposed, [K, N], with codes packed into int32 words, one
scale and one zero point per group of `group_size` consecutive k and output column:

  GPTQ   qweight int32 [K / p, N]   p = 32 / bits codes per word along K, code j at bits
                                    j*bits.. (the word's lowest bits first)
         qzeros  int32 [G, N / p]   along N the same way; the zero point is the stored value
                                    plus one (the original format's offset; zero_offset=0 for
                                    checkpoints written without it, "gptq_v2")
         scales        [G, N]       G = ceil(K / group_size)
         g_idx   int32 [K]          the group of each k: k // group_size, or in act-order
                                    ("desc_act") checkpoints a permutation of it; then K is
                                    stored reordered so that each group's k are consecutive, and
                                    the weight carries the order (NBitsWeight.k_order)
  AWQ    qweight int32 [K, N / 8]   4 bits, along N, the word's eight codes interleaved: output
                                    column 8c + i is code ORDER[i] of word c (shift 4 x ORDER[i])
         qzeros  int32 [G, N / 8]   the same packing, the zero point as stored
         scales        [G, N]

value = (q - zero point) x scale. The conversion reads the arrays' values (zero points past the
code range, the group order, whether every zero point is the implied 2^(bits-1)) and so runs on
concrete arrays, outside jit, in numpy; it returns device arrays.
"""

from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp

from jaxgemv._product import ACT_DTYPES

# Output column 8c + i of an AWQ word c is its code AWQ_ORDER[i] (the code at bits 4 x AWQ_ORDER[i]).
AWQ_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)


def _concrete(name: str, **arrays) -> dict[str, np.ndarray]:
    out = {}
    for field, v in arrays.items():
        if v is None:
            out[field] = None
            continue
        if not (hasattr(v, "dtype") and hasattr(v, "shape")):
            raise TypeError(f"{name}: {field} must be an array, got {type(v).__name__}")
        try:
            out[field] = np.asarray(v)
        except jax.errors.TracerArrayConversionError:
            raise TypeError(f"{name}: {field} is traced; convert checkpoints outside jax.jit (the conversion "
                            "checks the arrays' values)") from None
    return out


def _checked_arrays(name: str, a: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """qweight and qzeros as 2-D int32 words, scales 2-D."""
    for field in ("qweight", "qzeros"):
        v = a[field]
        if v.ndim != 2 or v.dtype not in (np.int32, np.uint32):
            raise TypeError(f"{name}: {field} must be int32 [rows, cols], got {v.dtype} {v.shape}")
    if a["scales"].ndim != 2:
        raise ValueError(f"{name}: scales must be [groups, N], got shape {a['scales'].shape}")
    return a["qweight"], a["qzeros"], a["scales"]


def _words(q: np.ndarray, bits: int) -> np.ndarray:
    """int32 words [..., W] -> their codes [..., W, 32 / bits], lowest bits first."""
    u = q.astype(np.int64) & 0xFFFFFFFF
    shifts = np.arange(0, 32, bits, dtype=np.int64)
    return ((u[..., None] >> shifts) & ((1 << bits) - 1)).astype(np.uint8)


def _block_size(name: str, group_size: int, k: int) -> tuple[int, int]:
    """(the layout's block size, the checkpoint's group in values) for a group size, -1 meaning one
    group for all of K: the group itself where the layout has it, else 128 (or the largest block
    that divides the group), each group's scale then repeated over its blocks."""
    from jaxgemv.nbits import BLOCK_SIZES

    group = k if group_size in (-1, 0) else group_size
    if group <= 0:
        raise ValueError(f"{name}: group_size must be positive or -1, got {group_size}")
    if group in BLOCK_SIZES:
        return group, group
    if group >= k:
        return 128, group  # one group for the whole row
    for bs in (128,) + tuple(sorted(BLOCK_SIZES, reverse=True)):
        if group % bs == 0:
            return bs, group
    raise ValueError(f"{name}: group_size {group_size} is not a multiple of a block size in {BLOCK_SIZES}")


def _scale_dtype(name: str, scales: np.ndarray, scale_dtype):
    dt = jnp.dtype(scales.dtype if scale_dtype is None else scale_dtype)
    if dt not in ACT_DTYPES:
        raise TypeError(f"{name}: scales are {dt}; pass scale_dtype (float16 or bfloat16, x's dtype)" if scale_dtype is None
                        else f"{name}: scale_dtype must be float16 or bfloat16, got {dt}")
    return dt


def _build(name: str, codes_nk: np.ndarray, zp_ng: np.ndarray, scales_ng: np.ndarray, bits: int, group_size: int,
           scale_dtype, k_order: np.ndarray | None = None):
    """MatMulNBits arrays from codes [N, K], zero points [N, G] and scales [N, G] (G groups of K),
    K stored in k_order where given (NBitsWeight.k_order)."""
    from jaxgemv import nbits

    n, k = codes_nk.shape
    bs, group = _block_size(name, group_size, k)
    groups = -(-k // group)
    if scales_ng.shape != (n, groups) or zp_ng.shape != (n, groups):
        raise ValueError(f"{name}: {groups} groups of {group} values along K = {k} need scales and zero points for "
                         f"[{n}, {groups}] (K x N layout: [{groups}, {n}]), got {scales_ng.shape[::-1]} and "
                         f"{zp_ng.shape[::-1]}")
    if zp_ng.max(initial=0) >= (1 << bits):
        raise ValueError(f"{name}: a zero point reaches {int(zp_ng.max())}, past the {bits}-bit code range (a GPTQ "
                         "checkpoint stored without the +1 offset needs zero_offset=0)")
    blocks = -(-k // bs)
    of_block = (np.arange(blocks) * bs) // group  # the group of each block (a block never straddles two)
    zp_nb = zp_ng[:, of_block].astype(np.uint8)
    scales_nb = scales_ng[:, of_block]
    # The last block's padding takes its zero point: it decodes to 0.
    pad = blocks * bs - k
    codes = np.concatenate([codes_nk, np.repeat(zp_nb[:, -1:], pad, axis=1)], axis=1) if pad else codes_nk
    codes = codes.reshape(n, blocks, bs)
    if bits == 4:
        packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    else:
        packed = codes
    zero_points = None
    if np.any(zp_nb != (1 << (bits - 1))):
        zc = zp_nb if bits == 8 or blocks % 2 == 0 else np.pad(zp_nb, ((0, 0), (0, 1)))
        zero_points = jnp.asarray(zc[:, 0::2] | (zc[:, 1::2] << 4) if bits == 4 else zc, jnp.uint8)
    scales = jnp.asarray(scales_nb, _scale_dtype(name, scales_nb, scale_dtype))
    order = None if k_order is None else jnp.asarray(k_order, jnp.int32)
    w = nbits.NBitsWeight(jnp.asarray(packed.astype(np.uint8)), scales, zero_points, bits, bs, k, order)
    nbits.check_weight(w, f"{name}: w")
    return w


def _act_order(name: str, g_idx: np.ndarray, k: int, group: int) -> np.ndarray | None:
    """The order of K that puts each group's k together (a stable sort by group), or None where
    g_idx is the identity order k // group. Every group must hold `group` k (the last one what is
    left), as GPTQ's act-order assigns them."""
    if g_idx.shape != (k,) or not np.issubdtype(g_idx.dtype, np.integer):
        raise ValueError(f"{name}: g_idx must be integer [K] = [{k}], got {g_idx.dtype} {g_idx.shape}")
    identity = np.arange(k) // group
    if np.array_equal(g_idx, identity):
        return None
    perm = np.argsort(g_idx, kind="stable")
    if not np.array_equal(g_idx[perm], identity):
        raise ValueError(f"{name}: g_idx does not give every group {group} values of K (group sizes "
                         f"{np.bincount(g_idx.clip(0)).tolist()[:8]}...)")
    return perm


def from_gptq(qweight, qzeros, scales, *, bits: int = 4, group_size: int, g_idx=None, zero_offset: int = 1,
              scale_dtype=None):
    name = "NBitsWeight.from_gptq"
    a = _concrete(name, qweight=qweight, qzeros=qzeros, scales=scales, g_idx=g_idx)
    if bits not in (4, 8):
        raise ValueError(f"{name}: bits must be 4 or 8, got {bits}")
    p = 32 // bits
    qw, qz, sc = _checked_arrays(name, a)
    k, n = qw.shape[0] * p, qw.shape[1]
    if qz.shape[1] * p < n or qz.shape[1] * p - n >= p:
        raise ValueError(f"{name}: qzeros must be [groups, ceil(N / {p})] = [*, {-(-n // p)}] for N = {n}, "
                         f"got {qz.shape}")
    perm = None
    if a["g_idx"] is not None:
        _, group = _block_size(name, group_size, k)
        perm = _act_order(name, a["g_idx"], k, group)
    codes = _words(qw, bits).transpose(1, 0, 2).reshape(n, k)  # [K / p, N, p] -> [N, K]
    if perm is not None:
        codes = np.ascontiguousarray(codes[:, perm])  # column j is k = perm[j]: group j // group_size
    zp = _words(qz, bits).reshape(qz.shape[0], -1)[:, :n].astype(np.int32) + int(zero_offset)
    if zp.min(initial=0) < 0:
        raise ValueError(f"{name}: zero_offset {zero_offset} makes a zero point negative")
    return _build(name, codes, zp.T, sc.T, bits, group_size, scale_dtype, perm)


def from_awq(qweight, qzeros, scales, *, group_size: int, scale_dtype=None):
    name = "NBitsWeight.from_awq"
    a = _concrete(name, qweight=qweight, qzeros=qzeros, scales=scales)
    qw, qz, sc = _checked_arrays(name, a)
    k, n = qw.shape[0], qw.shape[1] * 8
    if qz.shape[1] != qw.shape[1]:
        raise ValueError(f"{name}: qzeros must have qweight's {qw.shape[1]} columns, got {qz.shape}")
    order = np.asarray(AWQ_ORDER)
    codes = _words(qw, 4)[..., order].reshape(k, n).T  # [K, N / 8, 8] in column order -> [N, K]
    zp = _words(qz, 4)[..., order].reshape(qz.shape[0], n).astype(np.int32)
    return _build(name, np.ascontiguousarray(codes), zp.T, sc.T, 4, group_size, scale_dtype)
