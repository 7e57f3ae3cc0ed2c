"""FLOPs of one Keras training step on TensorFlow, from the shapes in the traced step's graph.

:func:`train_step_flops` traces ``model.train_step`` once more (``tf.function(...).get_concrete_function`` with
the input's ``element_spec``: nothing runs, no weight changes), keeps the ops the step really executes (the
ancestors of its outputs and of its stateful control outputs: a gradient TensorFlow builds but never uses, such as
the first convolution's grad-input, is pruned as TensorFlow's runtime prunes it) and counts, as torch's
``FlopCounterMode`` does, 2 FLOPs per multiply-add of

* ``MatMul``: ``2 * m * n * k``; ``BatchMatMul*``: ``2 * prod(output) * k``;
* ``Conv2D``: ``2 * prod(output) * kh * kw * Cin``; ``Conv2DBackpropInput``: ``2 * prod(out_backprop) * kh * kw
  * Cin``; ``Conv2DBackpropFilter``: ``2 * prod(out_backprop) * kh * kw * Cin`` (the forward's count each);

and nothing else (element-wise ops, reductions, the loss, the optimizer). Other contractions (``Einsum``,
``DepthwiseConv2dNative``, 3-D convolutions) and ops inside nested function calls are not counted: the count is
then a lower bound (``note`` says so). Every shape must be static: an input whose batch dimension is unknown
(``tf.data`` ``batch`` without ``drop_remainder=True``) gives NaN.
"""

from __future__ import annotations

import math
from typing import Any

import tensorflow as tf

_UNCOUNTED = frozenset(
    {
        "Einsum",
        "DepthwiseConv2dNative",
        "DepthwiseConv2dNativeBackpropInput",
        "DepthwiseConv2dNativeBackpropFilter",
        "Conv3D",
        "Conv3DBackpropInputV2",
        "Conv3DBackpropFilterV2",
        "Conv2DBackpropInputV2",
        "StatefulPartitionedCall",
        "PartitionedCall",
        "While",
        "StatelessWhile",
    }
)


def _dims(shape: Any) -> list[int] | None:
    dims = shape.as_list() if shape.rank is not None else None
    if dims is None or any(d is None for d in dims):
        return None
    return [int(d) for d in dims]


def _prod(dims: list[int]) -> int:
    out = 1
    for d in dims:
        out *= d
    return out


def _op_flops(op: Any) -> float | None:
    """FLOPs of one op (0 for ops that count nothing), None when a shape it needs is not static."""
    kind = op.type
    if kind == "MatMul":
        a, out = _dims(op.inputs[0].shape), _dims(op.outputs[0].shape)
        if a is None or out is None:
            return None
        k = a[0] if op.get_attr("transpose_a") else a[1]
        return 2.0 * _prod(out) * k
    if kind in ("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"):
        a, out = _dims(op.inputs[0].shape), _dims(op.outputs[0].shape)
        if a is None or out is None:
            return None
        k = a[-2] if op.get_attr("adj_x") else a[-1]
        return 2.0 * _prod(out) * k
    if kind in ("Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter"):
        if kind == "Conv2D":
            big, kernel = _dims(op.outputs[0].shape), _dims(op.inputs[1].shape)
        elif kind == "Conv2DBackpropInput":
            big, kernel = _dims(op.inputs[2].shape), _dims(op.inputs[1].shape)
        else:
            big, kernel = _dims(op.inputs[2].shape), _dims(op.outputs[0].shape)
        if big is None or kernel is None:
            return None
        kh, kw, cin = kernel[0], kernel[1], kernel[2]  # filters are (kh, kw, Cin, Cout) in both data formats
        return 2.0 * _prod(big) * kh * kw * cin
    return 0.0


def graph_flops(graph: Any, fetches: list[Any]) -> tuple[float, str]:
    """``(FLOPs, note)`` of the ops of ``graph`` that ``fetches`` (tensors and ops) depend on; NaN when a counted
    op's shape is not static (``note`` says why); a note also names the contractions left uncounted."""
    seen: set[str] = set()
    stack = [f.op if hasattr(f, "op") else f for f in fetches]
    total = 0.0
    uncounted: set[str] = set()
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        flops = _op_flops(op)
        if flops is None:
            return math.nan, f"{op.type} op {op.name!r} has a shape that is not static"
        total += flops
        if op.type in _UNCOUNTED:
            uncounted.add(op.type)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    note = f"not counted (lower bound): {', '.join(sorted(uncounted))}" if uncounted else ""
    return total, note


def train_step_flops(model: Any, element_spec: Any) -> tuple[float, str]:
    """``(FLOPs, note)`` of one ``model.train_step`` on a batch of ``element_spec`` (see the module docstring).
    Never raises: NaN and the reason instead."""
    if element_spec is None:
        return math.nan, "the input's element_spec is unknown"
    try:
        concrete = tf.function(model.train_step).get_concrete_function(element_spec)
        graph = concrete.graph
        return graph_flops(graph, list(graph.outputs) + list(graph.control_outputs))
    except Exception as err:
        return math.nan, f"the training step could not be traced for counting ({err!r})"


def static_batch(element_spec: Any) -> float:
    """The leading dimension of the first ``TensorSpec`` in ``element_spec`` (NaN when unknown: ``None``)."""
    for spec in tf.nest.flatten(element_spec):
        shape = getattr(spec, "shape", None)
        if shape is None or shape.rank is None or shape.rank == 0:
            continue
        first = shape[0]
        return math.nan if first is None else float(first)
    return math.nan


def device_and_dtype(model: Any) -> tuple[str, str]:
    """The first GPU's name ("" without one) and the model's compute dtype: ``tf32`` for float32 while TensorFlow's
    TF32 execution is on (its default; it covers matrix products and convolutions alike) on an NVIDIA GPU of
    compute capability 8.0 or later, where TF32 exists (not on a V100 or T4, nor on ROCm, whose devices report no
    compute capability)."""
    name = ""
    capability: tuple[int, ...] = ()
    try:
        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            details = tf.config.experimental.get_device_details(gpus[0])
            name = str(details.get("device_name", ""))
            capability = tuple(int(v) for v in details.get("compute_capability", ()) or ())
    except Exception:
        name = ""
    dtype = str(getattr(getattr(model, "dtype_policy", None), "compute_dtype", "float32"))
    if (
        name
        and dtype == "float32"
        and capability[:1] >= (8,)
        and tf.config.experimental.tensor_float_32_execution_enabled()
    ):
        dtype = "tf32"
    return name, dtype
