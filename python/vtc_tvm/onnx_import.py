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
* the Relax variables are named ``lv``, ``lv1``, ...: nothing says which ONNX node made them.
  ``load_onnx`` renames each binding after the ONNX tensor it computes (``onnx_tensor_names``
  maps the names back), so reports speak the model's language.

Every failure is an ``InputError``; its subclass says which kind (the CLI maps each to an exit
code): ``ModelError`` (unreadable or invalid model, unsupported dtype), ``UnsupportedOpError``,
``ShapeError`` (a given shape or size conflicts with the model, or a dim needs a size),
``UnknownNameError`` (a given shape or dim names nothing in the model).
"""

from __future__ import annotations

import os
import re
import warnings
from typing import Iterator, Mapping, Sequence

import onnx
import tvm
from google.protobuf.message import DecodeError
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

# Node domains the Relax importer has converters for (com.microsoft: contrib ops such as Attention).
_DOMAINS = {"", "ai.onnx", "com.microsoft"}


class InputError(ValueError):
    """The model (or the shapes given for it) cannot be imported; the message is one line."""


class ModelError(InputError):
    """The file is not a valid ONNX model we can type (missing, malformed, checker, dtype)."""


class UnsupportedOpError(InputError):
    """A node has no converter in TVM's ONNX frontend."""


class ShapeError(InputError):
    """A given shape or dim size conflicts with the model, or a dim needs a size."""


class UnknownNameError(InputError):
    """A shape or dim size names no input / no symbolic dim of the model."""


def load_onnx(path_or_model, shape_dict: Mapping[str, Sequence[int]] | None = None,
              keep_params_in_input: bool = False, dims: Mapping[str, int] | None = None,
              onnx_names: bool = True) -> tvm.IRModule:
    """Check and import an ONNX model (a path, bytes or ``ModelProto``) as a Relax module.

    ``shape_dict`` gives static shapes for inputs (required where a dim is unknown; optional
    for named symbolic dims, which otherwise stay symbolic). ``dims`` sizes named symbolic dims
    (``dim_param``) by name: they become static. Initializers stay constants unless
    ``keep_params_in_input``. With ``onnx_names`` the bindings are named after the ONNX tensors
    they compute (see :func:`onnx_tensor_names`); the module is otherwise the one ``from_onnx``
    builds.
    """
    model = _read(path_or_model)
    try:
        onnx.checker.check_model(model)
    except (onnx.checker.ValidationError, ValueError) as e:
        raise ModelError(f"invalid ONNX model: {_one_line(e)}") from None
    if dims:
        model = _size_dims(model, dict(dims))
    shapes = _input_shapes(model.graph, dict(shape_dict or {}))
    _check_ops(model)
    try:
        with warnings.catch_warnings():  # renaming notices etc.; the checks above cover the rest
            warnings.simplefilter("ignore")
            return _import(model, shapes, keep_params_in_input, onnx_names)
    except InputError:
        raise
    except Exception as e:  # a converter failure on a model that passed every check above
        raise InputError(f"TVM's ONNX importer failed: {type(e).__name__}: {_one_line(e)}") from None


def symbolic_dims(model: onnx.ModelProto) -> list:
    """The named symbolic dims (``dim_param``) of the graph inputs, in order of appearance."""
    found = []
    for i in model.graph.input:
        for d in i.type.tensor_type.shape.dim:
            if d.HasField("dim_param") and d.dim_param not in found:
                found.append(d.dim_param)
    return found


def _size_dims(model: onnx.ModelProto, dims: dict) -> onnx.ModelProto:
    """A copy of ``model`` whose graph inputs have the named symbolic dims of ``dims`` static."""
    known = symbolic_dims(model)
    unknown = [n for n in dims if n not in known]
    if unknown:
        raise UnknownNameError(f"--dim {unknown[0]}: the model has no symbolic dim of that name "
                               f"(symbolic dims: {', '.join(known) or 'none'})")
    bad = [(n, v) for n, v in dims.items() if not isinstance(v, int) or v <= 0]
    if bad:
        raise ShapeError(f"--dim {bad[0][0]}={bad[0][1]}: a size must be a positive integer")
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for i in model.graph.input:
        for d in i.type.tensor_type.shape.dim:
            if d.HasField("dim_param") and d.dim_param in dims:
                d.dim_value = dims[d.dim_param]  # clears dim_param (a oneof)
    return model


def sanitize_name(name: str) -> str:
    """An ONNX tensor name as a readable Relax identifier (``/conv1/Conv_output_0`` ->
    ``conv1_Conv_output_0``)."""
    ident = re.sub(r"\W+", "_", name).strip("_") or "t"
    return ident if not ident[0].isdigit() else f"t{ident}"


def onnx_tensor_names(model: onnx.ModelProto) -> dict:
    """``{Relax name: (ONNX node name, op type, ONNX tensor name)}`` for the names
    :func:`load_onnx` gives (the first match wins where two tensors sanitize alike)."""
    found = {}
    for node in _nodes(model.graph):
        for out in node.output:
            if out:
                found.setdefault(sanitize_name(out), (node.name, node.op_type, out))
        if len(node.output) > 1 and node.output[0]:
            found.setdefault(sanitize_name(node.output[0]) + "_parts", (node.name, node.op_type, node.output[0]))
    return found


def _import(model: onnx.ModelProto, shapes: dict, keep_params_in_input: bool, onnx_names: bool):
    """``from_onnx``, through its importer so its ONNX-name -> Relax-expression table is kept."""
    from tvm.relax.frontend.onnx.onnx_frontend import ONNXGraphImporter

    if model.ir_version < 3:
        raise ModelError(f"ONNX IR version {model.ir_version} is not supported (needs >= 3)")
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    importer = ONNXGraphImporter(shapes, "float32", keep_params_in_input=keep_params_in_input, sanitize=True)
    mod = importer.from_onnx(model.graph, opset)
    if not onnx_names:
        return mod
    names = {}
    for tensor, expr in importer._nodes.items():  # pylint: disable=protected-access
        if isinstance(expr, (relax.Call, relax.TupleGetItem, relax.DataflowVar)):
            names.setdefault(expr, sanitize_name(tensor))
    return _Renamer(mod, names).rename()


@mutator
class _Renamer(PyExprMutator):
    """Renames the bindings of ``main`` whose variable or value is a key of ``names``; a tuple
    whose parts are renamed (a Split) becomes ``<first part>_parts``."""

    def __init__(self, mod, names):
        super().__init__(mod)
        self.mod, self.names, self.parts = mod, names, {}
        for block in mod["main"].body.blocks:
            for b in block.bindings:
                name = names.get(b.var) or names.get(b.value)
                if isinstance(b.value, relax.TupleGetItem) and name and b.value.index == 0:
                    self.parts[b.value.tuple_value] = f"{name}_parts"

    def rename(self):
        gv = self.mod.get_global_var("main")
        self.builder_.update_func(gv, self.visit_expr(self.mod["main"]))
        return self.builder_.get()

    def visit_var_binding_(self, binding):
        name = self.names.get(binding.var) or self.names.get(binding.value) or self.parts.get(binding.var)
        if name is None:
            return super().visit_var_binding_(binding)
        value = self.visit_expr(binding.value)
        cls = relax.DataflowVar if isinstance(binding.var, relax.DataflowVar) else relax.Var
        new_var = cls(name, binding.var.ty)
        self.set_var_remap(binding.var, new_var)
        self.builder_.emit_normalized(relax.VarBinding(new_var, value))


def _read(src) -> onnx.ModelProto:
    if isinstance(src, onnx.ModelProto):
        return src
    try:
        if isinstance(src, (bytes, bytearray)):
            return onnx.load_model_from_string(bytes(src))
        if not os.path.isfile(src):
            raise ModelError(f"{src}: no such file" if not os.path.exists(src) else f"{src}: not a file")
        return onnx.load(os.fspath(src))  # resolves external data next to the file
    except DecodeError:
        label = "model bytes" if isinstance(src, (bytes, bytearray)) else src
        raise ModelError(f"{label}: not an ONNX model (malformed protobuf)") from None
    except OSError as e:
        raise ModelError(f"{src}: cannot read: {e.strerror or e}") from None


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
        raise ModelError(f"{what} has unsupported element type {names.get(elem_type, elem_type)}") from None


def _input_shapes(graph: onnx.GraphProto, given: dict) -> dict:
    """Static shapes of the graph inputs, checking dtypes and that ``given`` fills every free dim."""
    inits = {t.name for t in graph.initializer}
    inputs = [i for i in graph.input if i.name not in inits]
    unknown = set(given) - {i.name for i in inputs}
    if unknown:
        raise UnknownNameError(f"--shape names unknown input {sorted(unknown)[0]!r} "
                         f"(inputs: {', '.join(i.name for i in inputs) or 'none'})")
    for i in inputs:
        kind = i.type.WhichOneof("value")
        if kind != "tensor_type":
            raise ModelError(f"input {i.name!r} is a {kind or 'untyped value'}; only tensor inputs are supported")
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
                raise ShapeError(f"--shape {i.name}: {len(shape)} dims given, the model says rank "
                                 f"{len(dims)} {_fmt(dims)}")
            clash = [(k, d) for k, (s, d) in enumerate(zip(shape, dims)) if isinstance(d, int) and s != d]
            if clash or any(s < 0 for s in shape):
                k, d = clash[0] if clash else (0, "a size >= 0")
                raise ShapeError(f"--shape {i.name}={','.join(map(str, shape))} conflicts with the model "
                                 f"({_fmt(dims)}: dim {k} must be {d})")
            shapes[i.name] = shape
            continue
        example = ",".join(str(d) if isinstance(d, int) else "D" for d in dims)
        if not tt.HasField("shape"):
            raise ShapeError(f"input {i.name!r} has unknown rank; give its shape with --shape {i.name}=D1,D2,...")
        unknown = [k for k, d in enumerate(dims) if d == "?"]
        if unknown:
            raise ShapeError(f"input {i.name!r} has unknown dim {unknown[0]} in shape {_fmt(dims)}; "
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
            raise UnsupportedOpError(f"unsupported op {op} (node {node.name or '<unnamed>'!r}): "
                             "TVM's ONNX frontend has no converter for it")
