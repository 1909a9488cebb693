"""``vtc-tvm explain``'s pieces: the renderer consumes the plan dict of ``vtc_tvm.plan`` (nodes,
edges, conflicts, summary), the layout, readable mappings, and the ONNX names of the import."""

import glob
import os
import xml.etree.ElementTree as ET

import onnx
import pytest
import tvm_ffi

from vtc_tvm import explain
from vtc_tvm.mapping import Mapping
from vtc_tvm.onnx_import import load_onnx, onnx_tensor_names

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = sorted(glob.glob(os.path.join(ROOT, "benchmarks", "onnx", "*.onnx")))


def _plan():
    """A plan in the global planner's format, with a store edge and a conflict."""
    def node(i, op, virtual, src=()):
        return {"id": i, "name": i, "op": op, "onnx_node": f"/{i}/Node", "shape": [4, 8], "dtype": "float16",
                "bytes": 64, "virtual": virtual, "reason": f"why {i}", "sources": list(src)}

    nodes = [node("x", "input", False), node("t", "permute_dims", True, ["x"]), node("mm", "matmul", False, ["t"]),
             node("cat", "concat", False, ["mm"]), node("out", "add", False, ["cat"])]
    edges = [{"id": "e0", "src": "t", "dst": "mm", "kind": "load", "consumer": "matmul",
              "mapping": "(i, j) -> x[j, i]", "gain_us": 3.5, "kernels": -1, "memory": -64, "chosen": True,
              "reason": "saves a copy"},
             {"id": "e1", "src": "mm", "dst": "cat", "kind": "store", "consumer": "concat",
              "mapping": "(i, j) -> cat[i, j + 8]", "gain_us": -1.0, "kernels": 0, "memory": 0, "chosen": False,
              "reason": "slower on the device"}]
    return {"nodes": nodes, "edges": edges, "conflicts": [["e0", "e1"]],
            "summary": {"kernels": {"stock": 4, "vtc": 3}, "data_movement": {"stock": 2, "vtc": 1},
                        "planned_bytes": {"stock": 4096, "vtc": 2048}, "latency_ms": {"stock": 0.5, "vtc": 0.25},
                        "tensors": 2, "virtual": 1}}


def test_renders_a_plan_of_the_global_planner(monkeypatch):
    monkeypatch.setattr(explain.shutil, "which", lambda name: None)  # our own layout, not dot
    page = explain.render_html(_plan(), "tiny")
    for text in ("e0", "e1", "saves a copy", "slower on the device", "(i, j) -&gt; x[j, i]", "/t/Node",
                 "4.0 KiB", "0.2500", "<h2>Conflicts</h2><ul><li>e0, e1</li></ul>", "gain_us 3.5"):
        assert text in page, text
    svg = ET.fromstring(explain.render_svg(_plan()))
    rects = svg.findall(".//{http://www.w3.org/2000/svg}rect")
    assert len(rects) == 5
    assert len(svg.findall(".//{http://www.w3.org/2000/svg}path")) == 4 + len(explain._STYLE)  # + arrow heads


def test_layered_layout_goes_left_to_right():
    edges = [(s, d, "flow", "") for s, d in [("a", "b"), ("b", "c"), ("a", "c"), ("c", "d"), ("a", "e")]]
    pos, width, height = explain.layered_layout(list("abcde"), edges)
    assert all(pos[s][0] < pos[d][0] for s, d, *_ in edges)
    assert len(set(pos.values())) == 5 and width > max(x for x, _ in pos.values()) and height > 0


def test_format_mapping():
    transpose = Mapping.view((8, 4), "float32", (4, 8), lambda i, j: (j, i))
    assert explain.format_mapping(transpose, ["x"]) == "(i, j) -> x[j, i]"


@pytest.mark.parametrize("path", SHIPPED, ids=[os.path.basename(p)[:-5] for p in SHIPPED])
def test_onnx_names_keep_the_module(path):
    """Bindings are named after ONNX tensors; the module is from_onnx's (structurally equal). The
    exceptions are the importer's own index arithmetic inside one node (a ``Gather`` whose indices
    are an initializer: ``where(i < 0, i + n, i)`` from the input's shape), which no ONNX tensor names."""
    named, plain = load_onnx(path), load_onnx(path, onnx_names=False)
    assert tvm_ffi.structural_equal(named, plain)
    onnx_names = onnx_tensor_names(onnx.load(path))
    index_ops = {"relax.shape_of", "relax.shape_to_tensor", "relax.less", "relax.take", "relax.add", "relax.where"}
    unnamed = [(b.var.name, b.value.op.name, str(b.var.ty)) for block in named["main"].body.blocks
               for b in block.bindings if b.var.name not in onnx_names and b.var.name != "gv"]
    assert all(op in index_ops and ("int64" in ty or "bool" in ty or "Shape" in ty) for _, op, ty in unnamed), unnamed


def test_plan_of_the_compile(tmp_path):
    """The report renders the plan the compile emitted (``vtc_tvm.plan`` then ``vtc_tvm.emit``:
    the same module as the pass); tensors carry their op-made names, ONNX nodes and the
    planner's costs, load edges run to their consumer through the composed mapping."""
    import tvm_ffi as ffi

    import vtc_tvm
    from vtc_tvm.report import kernel_census

    path = os.path.join(ROOT, "benchmarks", "onnx", "shufflenet_unit_small.onnx")
    mod, rows = load_onnx(path), []
    chosen = vtc_tvm.plan(mod, "llvm", memory_guard=True)
    vtc = vtc_tvm.emit(mod, chosen)
    assert ffi.structural_equal(vtc, vtc_tvm.VirtualTensorize(target="llvm", memory_guard=True, report=rows)(mod))
    assert rows == chosen.rows
    census = {"stock": kernel_census(mod, "llvm"), "vtc": kernel_census(vtc, "llvm", stores=True)}
    plan = explain.plan_of(mod, chosen, census, path)
    nodes = {n["id"]: n for n in plan["nodes"]}
    split_1 = next(n for n in plan["nodes"] if n["tensor"] == "split_1")
    assert split_1["name"].startswith("split[1]#") and split_1["onnx_node"] == "node_split_0" and split_1["virtual"]
    reads = [e for e in plan["edges"] if e["src"] == split_1["id"] and e["kind"] == "load"]
    assert reads and all(e["chosen"] and e["gain_us"] is not None for e in reads)
    assert all(nodes[e["dst"]]["id"] != split_1["id"] and nodes[e["view_of"]]["tensor"] == "x" for e in reads), reads
    assert split_1["mapping"] == "(i, j, k, l) -> x[i, j + 8, k, l]", split_1["mapping"]
    assert split_1["id"] in sum((n["sources"] for n in plan["nodes"]), [])
    assert plan["summary"]["virtual"] == sum(n["virtual"] for n in plan["nodes"]) > 0
    physical = [n for n in plan["nodes"] if explain._is_movement(n) and not n["virtual"]]
    assert all(n["reason"] for n in physical)
    out = explain.write_report(plan, str(tmp_path / "r.html"), "unit")
    assert os.path.getsize(out["html"]) > 1000
