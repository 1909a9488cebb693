"""Validated ONNX import: ``load_onnx`` checks a model up front and turns every failure into an
``InputError`` with a one-line message.

TVM's ``from_onnx`` is lenient in ways that surface far from the cause (TVM 0.27):

* ``onnx.checker`` failures are only *warned* about; the import then dies with e.g. ``KeyError``.
* unsupported ops raise ``OpNotImplemented`` naming the op type but not the node or its domain
  (a custom-domain op whose name happens to be a standard op is silently imported as that op).
* unknown dims (neither a size nor a ``dim_param`` name) silently become fresh symbolic Relax
  dims, and ``dim_value`` 0 reads as unknown; unknown rank only warns. Named symbolic dims
  (``dim_param``) are fine: they stay symbolic, shared by name, and flow through mappings.
* complex and string tensors fail with ``ValueError: unknown dtype `complex64``` / ```object```.
"""

from __future__ import annotations

import os
import warnings
from typing import Iterator, Mapping, Sequence

import onnx
import tvm
from google.protobuf.message import DecodeError

# Node domains the Relax importer has converters for (com.microsoft: contrib ops such as Attention).
_DOMAINS = {"", "ai.onnx", "com.microsoft"}


class InputError(ValueError):
    """The model (or the shapes given for it) cannot be imported; the message is one line."""


def load_onnx(path_or_model, shape_dict: Mapping[str, Sequence[int]] | None = None,
              keep_params_in_input: bool = False) -> tvm.IRModule:
    """Check and import an ONNX model (a path, bytes or ``ModelProto``) as a Relax module.

    ``shape_dict`` gives static shapes for inputs (required where a dim is unknown; optional
    for named symbolic dims, which otherwise stay symbolic). Initializers stay constants unless
    ``keep_params_in_input``.
    """
    model = _read(path_or_model)
    try:
        onnx.checker.check_model(model)
    except (onnx.checker.ValidationError, ValueError) as e:
        raise InputError(f"invalid ONNX model: {_one_line(e)}") from None
    shapes = _input_shapes(model.graph, dict(shape_dict or {}))
    _check_ops(model)

    from tvm.relax.frontend.onnx import from_onnx

    try:
        with warnings.catch_warnings():  # renaming notices etc.; the checks above cover the rest
            warnings.simplefilter("ignore")
            return from_onnx(model, shape_dict=shapes, keep_params_in_input=keep_params_in_input)
    except Exception as e:  # a converter failure on a model that passed every check above
        raise InputError(f"TVM's ONNX importer failed: {type(e).__name__}: {_one_line(e)}") from None


def _read(src) -> onnx.ModelProto:
    if isinstance(src, onnx.ModelProto):
        return src
    try:
        if isinstance(src, (bytes, bytearray)):
            return onnx.load_model_from_string(bytes(src))
        if not os.path.isfile(src):
            raise InputError(f"{src}: no such file" if not os.path.exists(src) else f"{src}: not a file")
        return onnx.load(os.fspath(src))  # resolves external data next to the file
    except DecodeError:
        label = "model bytes" if isinstance(src, (bytes, bytearray)) else src
        raise InputError(f"{label}: not an ONNX model (malformed protobuf)") from None
    except OSError as e:
        raise InputError(f"{src}: cannot read: {e.strerror or e}") from None


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= 300 else text[:297] + "..."


def _dtype(elem_type: int, what: str) -> str:
    """The TVM dtype of an ONNX element type, or InputError naming ``what``."""
    try:
        dtype = str(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
        tvm.runtime.DataType(dtype)  # complex64/128 and string (numpy "object") are rejected here
        return dtype
    except Exception:
        names = dict((v, k) for k, v in onnx.TensorProto.DataType.items())
        raise InputError(f"{what} has unsupported element type {names.get(elem_type, elem_type)}") from None


def _input_shapes(graph: onnx.GraphProto, given: dict) -> dict:
    """Static shapes of the graph inputs, checking dtypes and that ``given`` fills every free dim."""
    inits = {t.name for t in graph.initializer}
    inputs = [i for i in graph.input if i.name not in inits]
    unknown = set(given) - {i.name for i in inputs}
    if unknown:
        raise InputError(f"--shape names unknown input {sorted(unknown)[0]!r} "
                         f"(inputs: {', '.join(i.name for i in inputs) or 'none'})")
    for i in inputs:
        kind = i.type.WhichOneof("value")
        if kind != "tensor_type":
            raise InputError(f"input {i.name!r} is a {kind or 'untyped value'}; only tensor inputs are supported")
        _dtype(i.type.tensor_type.elem_type, f"input {i.name!r}")
    for t in graph.initializer:
        _dtype(t.data_type, f"initializer {t.name!r}")
    for o in graph.output:
        if o.type.HasField("tensor_type"):
            _dtype(o.type.tensor_type.elem_type, f"output {o.name!r}")

    shapes = {}
    for i in inputs:
        tt = i.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim]
        if i.name in given:
            shape = [int(d) for d in given[i.name]]
            if tt.HasField("shape") and len(shape) != len(dims):
                raise InputError(f"--shape {i.name}: {len(shape)} dims given, the model says rank "
                                 f"{len(dims)} {_fmt(dims)}")
            clash = [(k, d) for k, (s, d) in enumerate(zip(shape, dims)) if isinstance(d, int) and s != d]
            if clash or any(s < 0 for s in shape):
                k, d = clash[0] if clash else (0, "a size >= 0")
                raise InputError(f"--shape {i.name}={','.join(map(str, shape))} conflicts with the model "
                                 f"({_fmt(dims)}: dim {k} must be {d})")
            shapes[i.name] = shape
            continue
        example = ",".join(str(d) if isinstance(d, int) else "D" for d in dims)
        if not tt.HasField("shape"):
            raise InputError(f"input {i.name!r} has unknown rank; give its shape with --shape {i.name}=D1,D2,...")
        unknown = [k for k, d in enumerate(dims) if d == "?"]
        if unknown:
            raise InputError(f"input {i.name!r} has unknown dim {unknown[0]} in shape {_fmt(dims)}; "
                             f"give static sizes with --shape {i.name}={example}")
        if all(isinstance(d, int) for d in dims):
            shapes[i.name] = dims  # also keeps a 0 (which from_onnx would read as unknown)
    return shapes


def _fmt(dims) -> str:
    return "[" + ", ".join(map(str, dims)) + "]"


def _nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """All nodes, including those of If/Loop/Scan bodies."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for g in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from _nodes(g)


def _check_ops(model: onnx.ModelProto) -> None:
    """Name the first node that ``from_onnx`` has no converter for (it reports only op types)."""
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

    supported = set(_get_convert_map()) | {"If", "Constant"}  # the two handled outside the map
    for node in _nodes(model.graph):
        if node.op_type not in supported or node.domain not in _DOMAINS:
            op = f"{node.domain}::{node.op_type}" if node.domain else node.op_type
            raise InputError(f"unsupported op {op} (node {node.name or '<unnamed>'!r}): "
                             "TVM's ONNX frontend has no converter for it")
