"""How a jaxgemv product partitions under pjit / NamedSharding.

A plain FFI call under pjit has its operands gathered and runs unsharded on every device. The
products here go through `custom_partitioning` instead, with a Shardy sharding rule (and the
GSPMD callbacks for JAX versions and configurations that still use GSPMD):

* W sharded on N (column-parallel): each device computes its columns of y, no communication.
* W sharded on K (row-parallel): each device computes a partial product over its K slice (times
  the row scale, which commutes with the sum); the partials are summed with a psum in float32,
  and the bias and the residual are added once, after the sum.
* x sharded on M (data-parallel), alone or with either of the above on other mesh axes.
* With an activation in the store (SwiGLU: gate and up rows interleaved by 8, y has N / 2
  columns), N is split only at 16-row groups, so each device holds whole gate/up pairs and
  computes its columns of y; a K split sums the pre-activations first and applies the
  activation after the sum, with the bias.

K is only ever split at scale-block boundaries: the rule writes K as a compound factor (blocks x
values per block) and lets only the block factor be sharded. When a sharding would split a block
anyway (GSPMD can ask for it), the partition keeps K whole and warns: slower, never wrong.

The format describes its weight arrays with a `WeightLayout`; nothing here is NVFP4-specific.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import re
import warnings
from typing import Callable, Sequence

import jax.numpy as jnp
from jax import lax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.interpreters import mlir
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P


@dataclasses.dataclass(frozen=True)
class WeightLayout:
    """Per weight array, what each dimension is: "n", ("k", units per block of K), or a plain
    label (any other string: a dimension kept whole).

    NVFP4: packed [N, K/2] is ("n", ("k", 8)), scales [N, K/16] ("n", ("k", 1)), the global
    scale () is a scalar. `block` is how many values of K one block covers: the unit K is split
    in, which must hold whole scale blocks (int4 with zero points: two blocks of the format, the
    two nibbles of one zero-point byte). A K that is not a whole number of blocks (a ragged last
    block) is kept whole.

    k_split=False: the format cannot be split along K; then every dimension that is not "n" is
    kept whole, and only N (and x's M) partition.
    """

    leaves: tuple[tuple, ...]
    block: int
    k_split: bool = True

    def splits_k(self, k: int, ways: int) -> bool:
        """Whether K splits `ways` ways at whole blocks: K a whole number of them, and that number
        divisible by `ways` (1: any layout that splits K at all)."""
        return self.k_split and k % self.block == 0 and (k // self.block) % ways == 0

    def shards_k(self, k: int, ways, name: str) -> bool:
        """The weights' `splits_k(ways)` (`name` the method, for the error): one way always holds,
        more where K splits at whole blocks."""
        if isinstance(ways, bool) or not isinstance(ways, numbers.Integral) or ways < 1:
            raise ValueError(f"{name}: ways must be a positive integer, got {ways!r}")
        return ways == 1 or self.splits_k(k, int(ways))

    def rule(self, k: int, present: tuple[bool, ...], axis_sizes: Sequence[int] = (), act_groups: int = 0
             ) -> tuple[str, dict]:
        """The Shardy rule for x, the weight arrays and the epilogue operands that `present` flags
        (bias [N], row scale [M], residual [M, N]; jaxgemv/_product.py: EPILOGUE) -> y.

        axis_sizes: the mesh's axis sizes. When one of them does not divide the number of scale
        blocks, K is kept whole: Shardy would otherwise shard the block factor over a sub-axis
        (for x sharded on K 8 ways against 2 blocks of 128), which the partition cannot take.
        act_groups > 0 (SwiGLU, N = 16 x act_groups): N is written as groups x (gate, up) x 8 rows
        and y's columns as groups x 8, and only the groups shard (kept whole when an axis does not
        divide them).
        """
        if act_groups:
            # SwiGLU's N (16 x act_groups rows) as groups x (gate, up) x 8 rows, y's columns as
            # groups x 8: only the groups shard, kept whole where an axis does not divide them.
            nw, ny = "(ng nt nr)", "(ng nr)"
            act_names = {"ng": act_groups, "nt": 2, "nr": 8}
            act_whole = ("nt", "nr") + (("ng",) if any(act_groups % a for a in axis_sizes if a > 1) else ())
        else:
            nw, ny, act_names, act_whole = "n", "n", {}, ()
        if self.k_split and not all(self.splits_k(k, size) for size in (1, *axis_sizes)):
            text, names = dataclasses.replace(self, k_split=False)._rule(k, present, nw, ny)
        else:
            text, names = self._rule(k, present, nw, ny)
        names = dict(names, **act_names)
        # Shardy wants the special factors in the order the factors first appear in the rule.
        order = {f: i for i, f in enumerate(dict.fromkeys(re.findall(r"[A-Za-z_]\w*", text)))}
        whole = tuple(names.get("need_replication_factors", ())) + act_whole
        names["need_replication_factors"] = tuple(sorted(whole, key=order.__getitem__))
        return text, names

    def _rule(self, k: int, present: tuple[bool, ...], nw: str = "n", ny: str = "n") -> tuple[str, dict]:
        """The rule with the weight's N written nw and y's columns ny."""
        if not self.k_split:
            operands, whole = ["m k"], ["k"]
            for i, dims in enumerate(self.leaves):
                parts = [nw if d == "n" else f"r{i}x{j}" for j, d in enumerate(dims)]
                whole += [p for p in parts if p != nw]
                operands.append(" ".join(parts))
            operands += _epilogue_factors(present, nw, ny)
            return ", ".join(operands) + f" -> m {ny}", dict(need_replication_factors=tuple(whole))
        names = {"kb": k // self.block, "kx": self.block}
        operands = ["m (kb kx)"]
        labels = []  # plain labels: dimensions kept whole
        for i, dims in enumerate(self.leaves):
            parts = []
            for j, d in enumerate(dims):
                if d == "n":
                    parts.append(nw)
                elif not _is_k(d):
                    labels.append(f"r{i}x{j}")
                    parts.append(labels[-1])
                elif d[1] == 1:
                    parts.append("kb")
                else:
                    names[f"kw{i}"] = d[1]
                    parts.append(f"(kb kw{i})")
            operands.append(" ".join(parts))
        operands += _epilogue_factors(present, nw, ny)
        inner = tuple(f for f in names if f != "kb") + tuple(labels)
        if any(_is_k(d) and d[1] == 1 for dims in self.leaves for d in dims):
            del names["kb"]  # a whole dimension somewhere: Shardy takes its size from there
        return ", ".join(operands) + f" -> m {ny}", dict(
            names, reduction_factors=("kb",), need_replication_factors=inner
        )


def _is_k(d) -> bool:
    """Whether a WeightLayout dimension is ("k", units): one that K splits."""
    return isinstance(d, tuple)


def empty_epilogue(x) -> tuple:
    """The three epilogue operands (bias, row scale, residual; jaxgemv/_product.py: EPILOGUE), all
    absent: empty arrays of their dtypes."""
    return jnp.zeros((0,), x.dtype), jnp.zeros((0,), jnp.float32), jnp.zeros((0,), x.dtype)


def _epilogue_factors(present: tuple[bool, ...], nw: str = "n", ny: str = "n") -> list[str]:
    """The rule's factors of the present epilogue operands: bias [N] (the weight's rows, nw), row
    scale [M], residual [M, N_out] (y's columns, ny)."""
    return [f for f, p in zip((nw, "m", f"m {ny}"), present) if p]


def _axes(entry) -> tuple[str, ...]:
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def _spec_entry(axes: tuple[str, ...]):
    return None if not axes else axes[0] if len(axes) == 1 else axes


def _dims(sharding, ndim: int) -> list[tuple[str, ...]]:
    spec = tuple(getattr(sharding, "spec", ())) + (None,) * ndim
    return [_axes(e) for e in spec[:ndim]]


def _choose(mesh, layout: WeightLayout, arg_shapes, act=None) -> tuple[tuple, tuple, tuple]:
    """(m axes, n axes, k axes) for the partitioned product, from the operands' shardings."""
    x = arg_shapes[0]
    m_axes = _dims(x.sharding, 2)[0]
    first = arg_shapes[1]
    wdims = _dims(first.sharding, len(layout.leaves[0]))
    n_axes = wdims[layout.leaves[0].index("n")]
    n = first.shape[layout.leaves[0].index("n")]
    n_shards = math.prod(mesh.shape[a] for a in n_axes)
    if act is not None and n_axes and n % (16 * n_shards):
        warnings.warn(
            f"jaxgemv: N = {n} (SwiGLU's gate and up rows, in groups of 16) cannot be split {n_shards} ways "
            "at group boundaries; computing with N replicated",
            stacklevel=2,
        )
        n_axes = ()
    k_axes = next(a for a, d in zip(wdims, layout.leaves[0]) if _is_k(d)) if layout.k_split else ()
    k = x.shape[1]
    shards = math.prod(mesh.shape[a] for a in k_axes)
    if k_axes and not layout.splits_k(k, shards):
        why = (f"is not a multiple of {layout.block}, the unit it splits in (whole scale blocks)" if k % layout.block
               else f"in blocks of {layout.block} cannot be split {shards} ways at block boundaries")
        warnings.warn(f"jaxgemv: K = {k} {why}; computing with K replicated", stacklevel=2)
        k_axes = ()
    if set(m_axes) & set(n_axes + k_axes):
        m_axes = ()
    return m_axes, n_axes, k_axes


def _operand_shardings(mesh, layout, m_axes, n_axes, k_axes, present):
    shardings = [NamedSharding(mesh, P(_spec_entry(m_axes), _spec_entry(k_axes)))]
    for dims in layout.leaves:
        shardings.append(
            NamedSharding(mesh, P(*(_spec_entry(n_axes if d == "n" else k_axes if _is_k(d) else ()) for d in dims)))
        )
    m, n = _spec_entry(m_axes), _spec_entry(n_axes)
    for spec, p in zip((P(n), P(m), P(m, n)), present):
        if p:
            shardings.append(NamedSharding(mesh, spec))
    return tuple(shardings)


@functools.lru_cache(maxsize=None)
def partitioned(inner: Callable, layout: WeightLayout, present: tuple[bool, bool, bool], act=None,
                plain: Callable | None = None) -> Callable:
    """`inner(x, *weight_arrays, bias, row_scale, residual)` (absent ones empty) as a partitioned
    product f(x, *weight_arrays, *present epilogue operands); `inner` must be hashable (cached per
    layout and epilogue). act: the activation inner applies (jaxgemv/_product.py: ACTIVATIONS),
    and plain the same product without it (hashable too), which a K split runs before its sum."""
    from jaxgemv import _product  # the activation's jnp form; _product imports this module
    nleaves = len(layout.leaves)

    def split(args):
        x, leaves = args[0], args[1 : 1 + nleaves]
        it = iter(args[1 + nleaves :])
        return x, leaves, tuple(next(it) if p else None for p in present)

    def full(x, extras):
        return tuple(e if a is None else a for a, e in zip(extras, empty_epilogue(x)))

    @custom_partitioning
    def product(*args):
        x, leaves, extras = split(args)
        return inner(x, *leaves, *full(x, extras))

    def partition(mesh, arg_shapes, result_shape):
        del result_shape
        m_axes, n_axes, k_axes = _choose(mesh, layout, arg_shapes, act)

        def lower(*args):
            x, leaves, extras = split(args)
            if not k_axes:
                return inner(x, *leaves, *full(x, extras))
            bias, row_scale, residual = extras
            y = (inner if act is None else plain)(x, *leaves, *full(x, (None, row_scale, None))).astype(jnp.float32)
            y = lax.psum(y, _spec_entry(k_axes))
            if bias is not None:
                y = y + bias.astype(jnp.float32)
            y = _product.apply_activation(y, act)
            if residual is not None:
                y = y + residual.astype(jnp.float32)
            return y.astype(x.dtype)

        out = NamedSharding(mesh, P(_spec_entry(m_axes), _spec_entry(n_axes)))
        return mesh, lower, out, _operand_shardings(mesh, layout, m_axes, n_axes, k_axes, present)

    def infer(mesh, arg_shapes, result_shape):
        del result_shape
        m_axes, n_axes, _ = _choose(mesh, layout, arg_shapes, act)
        return NamedSharding(mesh, P(_spec_entry(m_axes), _spec_entry(n_axes)))

    def rule(mesh, value_types: Sequence, result_types):
        del result_types
        k = mlir.ir.RankedTensorType(value_types[0]).shape[1]
        n = mlir.ir.RankedTensorType(value_types[1]).shape[layout.leaves[0].index("n")]
        return layout.rule(k, present, tuple(mesh.shape.values()), n // 16 if act is not None else 0)

    product.def_partition(partition, infer_sharding_from_operands=infer, sharding_rule=rule)
    return product


# ----------------------------------------------------------------------------------------------
# Placing a weight: the shardings of its arrays from one PartitionSpec of the [N, K] weight.


def _spec_axes(mesh, spec, name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(N's mesh axes, K's) of a PartitionSpec (or tuple) of at most two entries."""
    try:
        entries = tuple(spec)
    except TypeError:
        raise TypeError(f"{name}: spec must be a PartitionSpec of the [N, K] weight, got {spec!r}") from None
    if len(entries) > 2:
        raise ValueError(f"{name}: spec must have at most two entries (N's axes, K's), got {spec!r}")
    axes = []
    for e in entries + (None,) * (2 - len(entries)):
        if not (e is None or isinstance(e, str) or (isinstance(e, tuple) and all(isinstance(a, str) for a in e))):
            raise ValueError(f"{name}: each entry of spec must be None, a mesh axis name or a tuple of them, "
                             f"got {e!r}")
        axes.append(_axes(e))
    used = axes[0] + axes[1]
    for a in used:
        if a not in mesh.axis_names:
            raise ValueError(f"{name}: spec names axis {a!r}, which the mesh (axes {tuple(mesh.axis_names)}) "
                             "does not have")
    if len(set(used)) != len(used):
        raise ValueError(f"{name}: spec uses a mesh axis twice: {spec!r}")
    return axes[0], axes[1]


def weight_sharding(w, mesh, spec=P(), *, activation: str | None = None):
    """The shardings that place weight w as one [N, K] array partitioned by `spec`, in w's own
    structure: for `jax.device_put(w, ...)`, or a jit's `out_shardings` (quantize straight into
    the shards: pass `jax.eval_shape`'s weight) and `in_shardings`.

    w: an NVFP4Weight, FP8Weight or NBitsWeight (each array split along the dimensions that hold
      N or K, scale blocks and zero points with their rows and blocks; a block-scale array whose
      rows do not divide stays whole, and so do k_order and the global scale), or a plain [N, K]
      array (dense_matmul's weight; K splits in multiples of 8 values).
    mesh: a jax.sharding.Mesh.
    spec: PartitionSpec of [N, K]: P("tp", None) column-parallel, P(None, "tp") row-parallel, a
      tuple of axes for either entry, P() replicated.
    activation: "swiglu" for a weight of interleaved gate and up rows, whose N splits only at
      groups of 16 rows.

    Raises ValueError where the products could not use the placement as it is: N not a multiple
    of the shards (times 16 with SwiGLU), or K not whole scale blocks that many ways (w.splits_k).
    """
    name = "weight_sharding"
    quantized = hasattr(w, "partition_layout") and hasattr(w, "tree_flatten")
    if quantized:
        children, aux = w.tree_flatten()
        layout = w.partition_layout()
    elif hasattr(w, "shape") and len(w.shape) == 2:
        from jaxgemv import dense  # dense imports this module

        children, layout = [w], dense._LAYOUT_K8
    else:
        raise TypeError(f"{name}: w must be an NVFP4Weight, FP8Weight, NBitsWeight or an [N, K] array, "
                        f"got {type(w).__name__}")
    n, k = w.shape
    if not hasattr(mesh, "axis_names") or not hasattr(mesh, "shape"):
        raise TypeError(f"{name}: mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    if activation not in (None, "swiglu"):
        raise ValueError(f"{name}: activation={activation!r}: expected None or 'swiglu'")
    n_axes, k_axes = _spec_axes(mesh, spec, name)
    n_ways = math.prod(mesh.shape[a] for a in n_axes)
    k_ways = math.prod(mesh.shape[a] for a in k_axes)
    group = 16 if activation else 1
    if n % (group * n_ways):
        unit = " in groups of 16 rows (SwiGLU's gate and up pairs)" if activation else ""
        raise ValueError(f"{name}: N = {n} does not split {n_ways} ways over mesh axes {n_axes}{unit}")
    if not layout.shards_k(k, k_ways, name):
        unit = f"at whole scale blocks (w.splits_k({k_ways}) is False)" if quantized else "in multiples of 8 values"
        raise ValueError(f"{name}: K = {k} does not split {k_ways} ways over mesh axes {k_axes} {unit}")
    shardings = []
    for i, child in enumerate(children):
        if child is None:  # an absent array (NBitsWeight's zero points or k_order)
            shardings.append(None)
            continue
        # Past the layout's arrays (NBitsWeight's k_order): whole.
        dims = layout.leaves[i] if i < len(layout.leaves) else (None,) * len(child.shape)
        entries = []
        for size, d in zip(child.shape, dims):
            axes, ways = (n_axes, n_ways) if d == "n" else (k_axes, k_ways) if _is_k(d) else ((), 1)
            entries.append(_spec_entry(axes) if size % ways == 0 else None)
        shardings.append(NamedSharding(mesh, P(*entries)))
    return type(w).tree_unflatten(aux, shardings) if quantized else shardings[0]


# ----------------------------------------------------------------------------------------------
# decode_attention (jaxgemv/attention.py): qkv [B, W], k_cache and v_cache [B, KVH, T, hd], pos [B]
# -> o [B, H hd] and the two caches. The batch partitions (each device attends for its sequences
# with its slice of the caches), and so do the head groups when qkv comes in groups (qkv_groups:
# group j holds its query heads, then its key heads, then its value heads, so that a contiguous
# split of qkv's columns into shards of whole groups hands each device complete heads, and the
# caches' KV heads and o's columns split alike). Positions and head dimensions stay whole.


def _attention_rule(groups: int, batch: int, width: int, kv_heads: int, out_width: int,
                    axis_sizes: Sequence[int] = ()) -> tuple[str, dict]:
    """The Shardy rule; the batch (b) or the head groups (g) are kept whole when a mesh axis does
    not divide them (Shardy would otherwise split them over part of an axis, which the partition
    callback cannot be handed; for the groups, which share qkv's columns with the heads' widths,
    even a replicated compound factor was handed over split, so the rule then leaves them out)."""
    splits = lambda n: not any(n % a for a in axis_sizes if a > 1)  # noqa: E731
    b = () if splits(batch) else ("b",)
    if groups == 1 or not splits(groups):
        return ("b q, b h t e, b h t e, b -> b o, b h t e, b h t e",
                dict(need_replication_factors=b + ("q", "h", "t", "e", "o")))
    return ("b (g q), b (g h) t e, b (g h) t e, b -> b (g o), b (g h) t e, b (g h) t e",
            dict(g=groups, q=width // groups, h=kv_heads // groups, o=out_width // groups,
                 need_replication_factors=b + ("q", "h", "t", "e", "o")))


def partitioned_attention(inner: Callable, groups: int = 1) -> Callable:
    """inner(qkv, k_cache, v_cache, pos, shards) -> (o, k_cache, v_cache), qkv in `groups` head
    groups, as a call partitioned along the batch and (in whole groups) the heads; `shards` tells
    inner how many ways the heads were split."""

    @custom_partitioning
    def attend(qkv, k_cache, v_cache, pos):
        return inner(qkv, k_cache, v_cache, pos)

    def choose(mesh, arg_shapes):
        qkv = arg_shapes[0]
        b_axes, g_axes = _dims(qkv.sharding, 2)
        size = lambda axes: math.prod(mesh.shape[a] for a in axes)  # noqa: E731
        if g_axes and groups % size(g_axes):
            warnings.warn(f"jaxgemv: decode_attention's qkv in {groups} head group(s) cannot be split "
                          f"{size(g_axes)} ways (qkv_groups must be a multiple of the shards); computing with "
                          "the heads replicated", stacklevel=2)
            g_axes = ()
        if b_axes and (qkv.shape[0] % size(b_axes) or set(b_axes) & set(g_axes)):
            if qkv.shape[0] % size(b_axes):
                warnings.warn(f"jaxgemv: decode_attention's batch {qkv.shape[0]} cannot be split {size(b_axes)} ways; "
                              "computing it replicated", stacklevel=2)
            b_axes = ()
        return _spec_entry(b_axes), _spec_entry(g_axes), size(g_axes)

    def shardings(mesh, b, g):
        caches = NamedSharding(mesh, P(b, g, None, None))
        return NamedSharding(mesh, P(b, g)), caches, caches, NamedSharding(mesh, P(b))

    def partition(mesh, arg_shapes, result_shape):
        del result_shape
        b, g, shards = choose(mesh, arg_shapes)
        qkv, k_cache, v_cache, pos = shardings(mesh, b, g)
        lower = lambda *args: inner(*args, shards=shards)  # noqa: E731
        return mesh, lower, (qkv, k_cache, v_cache), (qkv, k_cache, v_cache, pos)

    def infer(mesh, arg_shapes, result_shape):
        del result_shape
        b, g, _ = choose(mesh, arg_shapes)
        qkv, k_cache, v_cache, _ = shardings(mesh, b, g)
        return qkv, k_cache, v_cache

    def rule(mesh, value_types: Sequence, result_types):
        batch, width = mlir.ir.RankedTensorType(value_types[0]).shape
        kv_heads = mlir.ir.RankedTensorType(value_types[1]).shape[1]
        out_width = mlir.ir.RankedTensorType(result_types[0]).shape[1]
        return _attention_rule(groups, batch, width, kv_heads, out_width, tuple(mesh.shape.values()))

    attend.def_partition(partition, infer_sharding_from_operands=infer, sharding_rule=rule)
    return attend


# ----------------------------------------------------------------------------------------------
# decoder_layer's fused primitive (jaxgemv/layer.py): x [B, D], four weights' three arrays each
# (packed [N, K/2], scales [N, K/16], global scale []), k_cache and v_cache [B, KVH, T, hd], pos
# [B] -> y [B, D] and the two caches. Only the batch partitions: the one call runs a whole layer,
# which needs every weight whole (a tensor-parallel layer needs all-reduces between its products,
# which decoder_layer(fuse=False) gets from the separate calls' own partitioning).


def _layer_rule(batch: int, axis_sizes: Sequence[int] = ()) -> tuple[str, dict]:
    """The Shardy rule: the batch (b) shards where every mesh axis divides it; everything else,
    the weights included, is replicated (gathered, where it came sharded)."""
    operands, whole = ["b d"], ["d"]
    for i in range(4):
        operands += [f"n{i} p{i}", f"n{i} s{i}", ""]
        whole += [f"n{i}", f"p{i}", f"s{i}"]
    operands += ["b h t e", "b h t e", "b"]
    whole += ["h", "t", "e"]
    if any(batch % a for a in axis_sizes if a > 1):
        whole.insert(0, "b")
    return ", ".join(operands) + " -> b d, b h t e, b h t e", dict(need_replication_factors=tuple(whole))


_LAYER_WEIGHTS = ("qkv", "o", "gate_up", "down")
_LAYER_LEAVES = ("packed", "scales", "global_scale")  # each NVFP4 weight's arrays, in the call's order


def partitioned_layer(inner: Callable) -> Callable:
    """inner(x, *12 weight arrays, k_cache, v_cache, pos) -> (y, k_cache, v_cache) as a call
    partitioned along the batch (each device runs the layer for its sequences, with its slice of
    the caches and every weight whole); `inner` must be hashable."""

    @custom_partitioning
    def layer(*args):
        return inner(*args)

    def batch_axes(mesh, arg_shapes):
        x = arg_shapes[0]
        b_axes, _ = _dims(x.sharding, 2)
        if b_axes and x.shape[0] % math.prod(mesh.shape[a] for a in b_axes):
            warnings.warn(f"jaxgemv: decoder_layer's batch {x.shape[0]} cannot be split "
                          f"{math.prod(mesh.shape[a] for a in b_axes)} ways; computing it replicated", stacklevel=2)
            b_axes = ()
        return _spec_entry(b_axes)

    def results(mesh, b):
        caches = NamedSharding(mesh, P(b, None, None, None))
        return NamedSharding(mesh, P(b, None)), caches, caches

    def partition(mesh, arg_shapes, result_shape):
        del result_shape
        b = batch_axes(mesh, arg_shapes)
        sharded = [f"{_LAYER_WEIGHTS[i // 3]}.{_LAYER_LEAVES[i % 3]}" for i, a in enumerate(arg_shapes[1:13])
                   if any(_dims(a.sharding, len(a.shape)))]
        if sharded:
            warnings.warn(f"jaxgemv: decoder_layer(fuse=True) takes every weight whole, and {', '.join(sharded[:4])}"
                          f"{' ...' if len(sharded) > 4 else ''} arrive sharded: each device gathers them. For "
                          "tensor-parallel weights pass fuse=False (the separate calls partition along N and K)",
                          stacklevel=2)
        y, k_cache, v_cache = results(mesh, b)
        weights = tuple(NamedSharding(mesh, P()) for _ in range(12))
        return mesh, inner, (y, k_cache, v_cache), (y, *weights, k_cache, v_cache, NamedSharding(mesh, P(b)))

    def infer(mesh, arg_shapes, result_shape):
        del result_shape
        return results(mesh, batch_axes(mesh, arg_shapes))

    def rule(mesh, value_types: Sequence, result_types):
        del result_types
        return _layer_rule(mlir.ir.RankedTensorType(value_types[0]).shape[0], tuple(mesh.shape.values()))

    layer.def_partition(partition, infer_sharding_from_operands=infer, sharding_rule=rule)
    return layer
