"""``vtc-tvm explain``: a report a person reads about what VirtualTensorize did to a model.

The report is rendered from a *plan dict*: :func:`plan_of` makes it from the plan the compile
emitted (``vtc_tvm.plan`` then ``vtc_tvm.emit``, so nothing is planned twice)::

    {"nodes": [{"id", "name", "tensor", "op", "onnx_node", "shape", "dtype", "bytes", "virtual",
                "reason", "sources", "mapping"?}],
     "edges": [{"id", "src", "dst", "view_of"?, "kind": "load"|"store", "consumer", "mapping",
                "gain_us", "kernels", "memory", "chosen", "reason"}],
     "conflicts": [[edge ids]], "summary": {...}}

Tensors are named by the op that made them (``permute_dims#3``), with their ONNX node; a load
edge runs from the tensor to the consumer that reads it through its composed mapping, with the
cost the planner predicted (or measured) for it.

Output: a self-contained HTML page (inline SVG, no script, no external file) and a PNG of it
(headless Chromium when installed, else Graphviz ``dot`` for the graph alone, else none, with a
note). The graph is laid out by ``dot`` when installed, otherwise by :func:`layered_layout`.

Limits: 1. the drawing shows every Relax function's tensors in one graph. 2. store edges carry
no mapping in words (their slice offsets are in the reason).
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import tempfile
from typing import Optional

from tvm import relax


# -- the plan dict ---------------------------------------------------------------------------------
def plan_of(mod, chosen, census, model_path: Optional[str] = None) -> dict:
    """The plan dict of ``chosen`` (the :class:`vtc_tvm.plan.Plan` the compile emitted for
    ``mod``): ``chosen.to_json()`` with ids made strings (``t3``, ``e5``), each tensor's
    variable, ONNX node and the tensors it reads (``sources``, for the drawing), each load
    edge drawn to its consumer (``view_of``: the tensor it reads in its place) with its
    composed mapping in words, and ``summary`` holding the kernel census (and latency) of
    stock and vtc. A movement tensor is virtual as the plan says (the emitted module no longer
    computes it: that covers one composed into its readers' mappings, a split part read only by
    a concat that became virtual, which has no edge of its own). Only tensors the plan is about
    are kept: movement tensors, what their edges join and what they read."""
    plan = json.loads(chosen.to_json())
    graph, onnx_names = chosen.graph, _onnx_names(model_path)
    tid = lambda i: f"t{i}"  # noqa: E731
    bindings = _bindings(mod)
    for n, row in zip(graph.nodes, plan["nodes"]):
        var = n.var.name if isinstance(n.var, relax.Var) else None
        onnx_node, onnx_op, _ = onnx_names.get(var, (None, None, None))
        b = bindings.get(n.var)
        reads = _tensor_args(b.value, bindings) if b is not None else []
        row.update(id=tid(n.id), tensor=var, op=n.op.split("relax.", 1)[-1], movement=n.movement,
                   onnx_node=onnx_node or row.get("onnx_node"), onnx_op=onnx_op,
                   sources=list(dict.fromkeys(tid(graph.by_var[a].id) for a in reads if a in graph.by_var)))
    nodes = {row["id"]: row for row in plan["nodes"]}
    for e, row in zip(graph.edges, plan["edges"]):
        row.update(id=f"e{e.id}", src=tid(e.src), dst=tid(e.dst))
        if e.kind == "load":
            labels = [_source_label(x, graph, onnx_names) for x in e.source_exprs]
            row.update(view_of=tid(e.dst), dst=tid(e.consumer) if e.consumer is not None else None,
                       mapping=format_mapping(e.mapping, labels) if e.mapping is not None and labels else row["mapping"])
            src = nodes.get(row["src"])
            if src is not None and row["mapping"] and not src.get("mapping"):
                src["mapping"] = row["mapping"]
    keep = {row["id"] for row in plan["nodes"] if row["movement"]}
    keep |= {n for row in plan["nodes"] if row["movement"] for n in row["sources"]}
    keep |= {row[k] for row in plan["edges"] for k in ("src", "dst", "view_of") if row.get(k)}
    plan["nodes"] = [dict(row, sources=[x for x in row["sources"] if x in keep])
                     for row in plan["nodes"] if row["id"] in keep]
    plan["conflicts"] = [[f"e{i}" for i in c] for c in plan.get("conflicts") or []]
    summary = dict(plan.get("summary") or {})
    for key in ("kernels", "data_movement", "planned_bytes", "latency_ms"):
        summary[key] = {v: census[v].get(key) for v in ("stock", "vtc")}
    summary["tensors"] = sum(1 for n in graph.nodes if n.movement)
    summary["virtual"] = sum(1 for row in plan["nodes"] if row.get("virtual"))
    plan["summary"] = summary
    return plan


def _bindings(mod) -> dict:
    """{var: binding} over every Relax function of ``mod``."""
    return {b.var: b for f in mod.functions.values() if isinstance(f, relax.Function)
            for block in f.body.blocks for b in block.bindings}


def _source_label(expr, graph, onnx_names) -> str:
    """A mapping source in words: its ONNX tensor name, else the plan's name of it."""
    if isinstance(expr, relax.Var) and expr.name in onnx_names:
        return expr.name
    node = graph.by_var.get(expr) if isinstance(expr, relax.Var) else None
    return node.name if node is not None else _label(expr)


def _onnx_names(model_path) -> dict:
    if not model_path:
        return {}
    import onnx

    from .onnx_import import onnx_tensor_names

    try:
        return onnx_tensor_names(onnx.load(model_path, load_external_data=False))
    except Exception:  # noqa: BLE001 - names are a nicety; the report works without them
        return {}


def _is_movement(node) -> bool:
    """Whether a plan node is a data-movement tensor (one the plan could make virtual)."""
    from .rules import registered_ops

    if "movement" in node:
        return bool(node["movement"])
    op, ops = str(node.get("op")), registered_ops()
    return bool(node.get("mapping")) or op in ops or f"relax.{op}" in ops


def unique_decisions(decisions) -> list:
    """The pass's decision rows without repeats (its rounds can log an edge twice), as strings."""
    seen, rows = set(), []
    for d in decisions:
        row = {"tensor": str(d["tensor"]), "consumer": str(d["consumer"]), "virtual": bool(d["virtual"]),
               "reason": str(d["reason"])}
        key = tuple(row.values())
        if key not in seen:
            seen.add(key)
            rows.append(row)
    return rows


def _tensor_args(value, by_var) -> list:
    """The tensors ``value`` reads, with tuple literals (and tuple-bound vars) opened."""
    if isinstance(value, relax.TupleGetItem):
        return [value.tuple_value]
    if not isinstance(value, relax.Call):
        return []
    found = []
    for a in value.args:
        bound = by_var.get(a) if isinstance(a, relax.Var) else None
        if isinstance(a, relax.Tuple) or (bound is not None and isinstance(bound.value, relax.Tuple)):
            found += list((a if isinstance(a, relax.Tuple) else bound.value).fields)
        elif isinstance(a.ty, relax.TensorType) or isinstance(a, relax.Var):
            found.append(a)
    return found


def _label(expr) -> str:
    return expr.name if isinstance(expr, relax.Var) else "const"


_LETTERS = "ijklmnpqrstuvw"


def format_mapping(mapping, source_names) -> str:
    """``(i, j) -> x[j, i]``; piecewise maps as ``a[..] if cond else b[..]``."""
    names = {v.name: _LETTERS[k] if k < len(_LETTERS) else f"i{k}" for k, v in enumerate(mapping.vars)}

    def text(expr) -> str:
        s = re.sub(r"T\.u?int\d+\((-?\d+)\)", r"\1", str(expr))
        s = re.sub(r"\bsrc(\d+)\b", lambda m: source_names[int(m.group(1))]
                   if int(m.group(1)) < len(source_names) else m.group(0), s)
        return re.sub(r"\bv(\d+)\b", lambda m: names.get(m.group(0), m.group(0)), s)

    def piece(p) -> str:
        if p.source is None:
            return text(p.value) if p.value is not None else "0"
        return f"{source_names[p.source]}[{', '.join(text(e) for e in p.indices)}]"

    head = f"({', '.join(names[v.name] for v in mapping.vars)})"
    pieces = list(mapping.pieces)
    body = piece(pieces[-1])
    for p in reversed(pieces[:-1]):
        body = f"{piece(p)} if {text(p.cond)} else {body}"
    return f"{head} -> {body}"


# -- layout ------------------------------------------------------------------------------------------
def graph_edges(plan) -> list:
    """(src, dst, style, label) of the drawing: data flow source -> tensor -> consumer."""
    nodes = {n["id"]: n for n in plan["nodes"]}
    drawn, covered = [], set()
    for e in plan["edges"]:
        if e.get("src") in nodes and e.get("dst") in nodes:
            style = ("store" if e.get("kind") == "store" else "load") + ("-chosen" if e.get("chosen") else "-refused")
            drawn.append((e["src"], e["dst"], style, e["id"]))
            covered.add((e["src"], e["dst"]))
    for n in plan["nodes"]:
        for s in n.get("sources") or []:
            if s in nodes and (s, n["id"]) not in covered:
                drawn.append((s, n["id"], "virtual-src" if n.get("virtual") else "flow", ""))
    return drawn


_TOP_LANE = 34  # room above the boxes for the edges that skip layers


def layered_layout(node_ids, edges, box=(190, 58), gap=(70, 22)):
    """Left-to-right layered layout: layer = longest path from a root, order in a layer by the
    mean position of the predecessors (one sweep). Returns ({id: (x, y)}, width, height)."""
    preds = {n: [] for n in node_ids}
    for s, d, *_ in edges:
        if s in preds and d in preds and s != d:
            preds[d].append(s)
    layer: dict = {}

    def depth(n, stack=()):
        if n not in layer:
            if n in stack:  # a cycle (should not happen in a DAG): cut it
                return 0
            layer[n] = 1 + max((depth(p, stack + (n,)) for p in preds[n]), default=-1)
        return layer[n]

    for n in node_ids:
        depth(n)
    columns: dict = {}
    for n in node_ids:
        columns.setdefault(layer[n], []).append(n)
    pos: dict = {}
    for col in sorted(columns):
        members = columns[col]
        if col:
            def key(n):
                ys = [pos[p][1] for p in preds[n] if p in pos]
                return sum(ys) / len(ys) if ys else 0.0
            members.sort(key=key)
        for row, n in enumerate(members):
            pos[n] = (20 + col * (box[0] + gap[0]), _TOP_LANE + row * (box[1] + gap[1]))
    width = 40 + (max(columns, default=0) + 1) * (box[0] + gap[0]) - gap[0]
    height = _TOP_LANE + 20 + max((len(m) for m in columns.values()), default=1) * (box[1] + gap[1]) - gap[1]
    return pos, width, height


_STYLE = {  # stroke, dash, width
    "flow": ("#8a8f98", "", 1.2),
    "virtual-src": ("#2b6cb0", "5,3", 1.6),
    "load-chosen": ("#2f855a", "", 2.2),
    "load-refused": ("#c53030", "6,3", 1.8),
    "store-chosen": ("#6b46c1", "", 2.2),
    "store-refused": ("#c53030", "6,3", 1.8),
}


def _node_fill(n) -> tuple:
    if _is_movement(n):
        return ("#e6fffa", "#2f855a", "6,3") if n.get("virtual") else ("#fff5eb", "#c05621", "")
    if n["op"] in ("input", "const"):
        return ("#f7fafc", "#718096", "")
    return ("#edf2f7", "#4a5568", "")


def _clip(text, n=27) -> str:
    text = str(text)
    return text if len(text) <= n else text[: n - 1] + "\u2026"


def render_svg(plan) -> str:
    """The graph as an SVG document (by ``dot`` when installed, else :func:`layered_layout`)."""
    drawn = graph_edges(plan)
    svg = _dot_svg(plan, drawn) if shutil.which("dot") else None
    if svg is not None:
        return svg
    box = (190, 58)
    pos, width, height = layered_layout([n["id"] for n in plan["nodes"]], drawn, box)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif" font-size="11">',
           "<defs>" + "".join(
               f'<marker id="arrow-{k}" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
               f'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{c}"/></marker>'
               for k, (c, _, _) in _STYLE.items()) + "</defs>"]
    for s, d, style, label in drawn:
        (x1, y1), (x2, y2) = pos[s], pos[d]
        x1, y1, x2, y2 = x1 + box[0], y1 + box[1] / 2, x2, y2 + box[1] / 2
        if x2 <= x1:  # same or earlier layer: go around below
            path = f"M{x1},{y1} C{x1 + 60},{y1 + 60} {x2 - 60},{y2 + 60} {x2},{y2}"
        elif x2 - x1 > box[0] + 80:  # skips a layer: over the top lane, not through the boxes between
            lane = 10
            path = (f"M{x1},{y1} C{x1 + 45},{y1} {x1 + 25},{lane} {x1 + 70},{lane} "
                    f"L{x2 - 70},{lane} C{x2 - 25},{lane} {x2 - 45},{y2} {x2},{y2}")
        else:
            mid = (x1 + x2) / 2
            path = f"M{x1},{y1} C{mid},{y1} {mid},{y2} {x2},{y2}"
        color, dash, w = _STYLE[style]
        out.append(f'<path d="{path}" fill="none" stroke="{color}" stroke-width="{w}"'
                   + (f' stroke-dasharray="{dash}"' if dash else "") + f' marker-end="url(#arrow-{style})"/>')
        if label:
            out.append(f'<text x="{(x1 + x2) / 2}" y="{(y1 + y2) / 2 - 4}" text-anchor="middle" '
                       f'fill="{color}" font-weight="bold">{html.escape(label)}</text>')
    for n in plan["nodes"]:
        x, y = pos[n["id"]]
        fill, stroke, dash = _node_fill(n)
        out.append(f'<g><title>{html.escape(_tooltip(n))}</title>'
                   f'<rect x="{x}" y="{y}" width="{box[0]}" height="{box[1]}" rx="6" fill="{fill}" '
                   f'stroke="{stroke}" stroke-width="1.5"' + (f' stroke-dasharray="{dash}"' if dash else "") + "/>")
        lines = [(_clip(n["name"]), "bold"), (_clip(_op_line(n), 31), "normal"), (_clip(_shape_line(n), 31), "normal")]
        for k, (t, weight) in enumerate(lines):
            out.append(f'<text x="{x + 8}" y="{y + 16 + 15 * k}" font-weight="{weight}" '
                       f'fill="#1a202c">{html.escape(t)}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)


def _op_line(n) -> str:
    onnx_node = n.get("onnx_node")
    return f"{n['op']}" + (f"  \u00b7 ONNX {onnx_node}" if onnx_node else "")


def _shape_line(n) -> str:
    if n.get("shape") is None:
        return ""
    kind = " virtual" if n.get("virtual") else ""
    return f"{n['dtype']}[{', '.join(map(str, n['shape']))}]{kind}"


def _tooltip(n) -> str:
    return " | ".join(str(x) for x in (n["name"], n["op"], n.get("onnx_node"), n.get("mapping"), n.get("reason")) if x)


def _dot_svg(plan, drawn) -> Optional[str]:
    lines = ["digraph vtc {", 'rankdir=LR; node [shape=box, style="rounded,filled", fontname="Helvetica", '
             "fontsize=10]; edge [fontname=Helvetica, fontsize=9];"]
    for n in plan["nodes"]:
        fill, stroke, dash = _node_fill(n)
        label = "\\n".join(_dot_escape(t) for t in (n["name"], _op_line(n), _shape_line(n)) if t)
        style = '"rounded,filled,dashed"' if dash else '"rounded,filled"'
        lines.append(f'"{_dot_escape(n["id"])}" [label="{label}", fillcolor="{fill}", color="{stroke}", style={style}];')
    for s, d, style, label in drawn:
        color, dash, w = _STYLE[style]
        attrs = f'color="{color}", penwidth={w}' + (", style=dashed" if dash else "") + (f', label="{label}"' if label else "")
        lines.append(f'"{_dot_escape(s)}" -> "{_dot_escape(d)}" [{attrs}];')
    lines.append("}")
    try:
        svg = subprocess.run(["dot", "-Tsvg"], input="\n".join(lines), capture_output=True, text=True,
                             timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return svg[svg.index("<svg"):] if "<svg" in svg else None


def _dot_escape(text) -> str:
    return str(text).replace("\\", "\\\\").replace('"', '\\"')


# -- the page ---------------------------------------------------------------------------------------
_CSS = """
body { font-family: Helvetica, Arial, sans-serif; margin: 24px; color: #1a202c; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px; }
table { border-collapse: collapse; font-size: 13px; margin-top: 6px; }
th, td { border: 1px solid #cbd5e0; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #edf2f7; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
code { font-family: Menlo, Consolas, monospace; font-size: 12px; }
.virtual { color: #2f855a; font-weight: bold; } .physical { color: #c05621; font-weight: bold; }
.refused { color: #c53030; font-weight: bold; } .muted { color: #718096; font-size: 12px; }
.graph { border: 1px solid #e2e8f0; border-radius: 6px; padding: 8px; overflow-x: auto; }
.legend span { display: inline-block; margin-right: 18px; font-size: 12px; }
"""


def _fmt_bytes(n) -> str:
    if n is None:
        return "-"
    return f"{n / 2**20:.3f} MiB" if n >= 2**20 else (f"{n / 2**10:.1f} KiB" if n >= 1024 else f"{n} B")


def render_html(plan, title: str = "model") -> str:
    """The whole report as one self-contained HTML page."""
    e = html.escape
    s = plan["summary"]
    rows = [("kernels", s.get("kernels")), ("data-movement kernels", s.get("data_movement")),
            ("planned intermediate memory", s.get("planned_bytes")), ("latency (ms)", s.get("latency_ms"))]
    summary = []
    for label, val in rows:
        if not val or all(v is None for v in val.values()):
            if label.startswith("latency"):
                summary.append(f"<tr><td>{label}</td><td colspan=2 class=muted>not measured "
                               "(run with --time on a machine with the target's device)</td></tr>")
            continue
        show = _fmt_bytes if "memory" in label else (lambda v: "-" if v is None else
                                                     (f"{v:.4f}" if isinstance(v, float) else str(v)))
        summary.append(f"<tr><td>{label}</td><td class=num>{show(val['stock'])}</td>"
                       f"<td class=num>{show(val['vtc'])}</td></tr>")
    nodes = {n["id"]: n for n in plan["nodes"]}
    edge_rows = []
    for ed in plan["edges"]:
        src, dst = nodes.get(ed["src"], {}), nodes.get(ed.get("dst"), {})
        verdict = '<span class=virtual>read through</span>' if ed.get("chosen") else '<span class=refused>copy stays</span>'
        extra = " / ".join(f"{k} {ed[k]}" for k in ("gain_us", "kernels", "memory") if ed.get(k) is not None) or "-"
        edge_rows.append(
            f"<tr><td><b>{e(ed['id'])}</b></td><td>{e(_who(src))}</td><td>{e(_who(dst) if dst else ed['consumer'])}"
            f" <span class=muted>({e(ed['consumer'])}, {e(ed.get('kind', 'load'))})</span></td>"
            f"<td><code>{e(ed.get('mapping') or '-')}</code></td><td>{verdict}</td><td>{e(ed.get('reason') or '')}</td>"
            f"<td class=muted>{e(extra)}</td></tr>")
    tensor_rows = []
    for n in plan["nodes"]:
        if not _is_movement(n):
            continue
        kind = '<span class=virtual>virtual</span>' if n.get("virtual") else '<span class=physical>physical</span>'
        shape = f"{n['dtype']}[{', '.join(map(str, n['shape']))}]" if n.get("shape") is not None else "-"
        tensor_rows.append(
            f"<tr><td><b>{e(n['name'])}</b></td><td>{e(n['op'])}</td><td>{e(n.get('onnx_node') or '-')}</td>"
            f"<td><code>{e(shape)}</code></td><td class=num>{_fmt_bytes(n.get('bytes'))}</td><td>{kind}</td>"
            f"<td>{e(n.get('reason') or '')}</td></tr>")
    conflicts = "".join(f"<li>{e(', '.join(c))}</li>" for c in plan.get("conflicts") or [])
    legend = ('<div class=legend><span style="color:#2f855a">&#9633; dashed box: virtual tensor (no kernel, '
              'no memory)</span><span style="color:#c05621">&#9633; orange box: physical movement tensor</span>'
              '<span style="color:#2f855a">&#8594; consumer reads through the mapping</span>'
              '<span style="color:#c53030">&#8674; edge refused: the copy stays</span>'
              '<span style="color:#2b6cb0">&#8674; source of a virtual tensor (read in its place)</span>'
              '<span style="color:#8a8f98">&#8594; plain data flow</span></div>')
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>vtc-tvm explain: {e(title)}</title><style>{_CSS}</style></head>
<body>
<h1>vtc-tvm explain: {e(title)}</h1>
<div class=muted>{s.get('virtual', 0)} of {s.get('tensors', 0)} data-movement tensors became virtual.
Names are the ONNX tensors' (node in the second line of a box).</div>
<h2>Stock TVM vs vtc</h2>
<table><tr><th></th><th>stock</th><th>vtc</th></tr>{''.join(summary)}</table>
<h2>Points-to graph</h2>{legend}
<div class=graph>{render_svg(plan)}</div>
<h2>Edges: which consumer reads which tensor, and how</h2>
<table><tr><th>edge</th><th>tensor</th><th>consumer</th><th>mapping</th><th>decision</th><th>why</th>
<th>gain / kernels / memory</th></tr>{''.join(edge_rows) or '<tr><td colspan=7>no data-movement edges</td></tr>'}</table>
<h2>Data-movement tensors</h2>
<table><tr><th>tensor</th><th>op</th><th>ONNX node</th><th>type</th><th>size</th><th>result</th><th>why</th></tr>
{''.join(tensor_rows) or '<tr><td colspan=7>none</td></tr>'}</table>
{f'<h2>Conflicts</h2><ul>{conflicts}</ul>' if conflicts else ''}
</body></html>
"""


def _who(n) -> str:
    if not n:
        return "-"
    return f"{n['name']} ({n['op']}" + (f", ONNX {n['onnx_node']})" if n.get("onnx_node") else ")")


# -- files ------------------------------------------------------------------------------------------
def write_report(plan, html_path: str, title: str = "model") -> dict:
    """Write the HTML page and a PNG next to it; returns {"html", "png"} (and ``png_skipped``,
    the reason, when no PNG could be made)."""
    page = render_html(plan, title)
    with open(html_path, "w", encoding="utf-8") as f:
        f.write(page)
    png = os.path.splitext(html_path)[0] + ".png"
    written = {"html": os.path.abspath(html_path)}
    width, height = _page_size(plan)
    why = screenshot(html_path, png, height, width)
    if why is None:
        written["png"] = os.path.abspath(png)
    else:
        written["png_skipped"] = why
    return written


def _page_size(plan) -> tuple:
    """A window that shows the whole page (the graph at its own size) without scrolling."""
    _, graph_w, graph_h = layered_layout([n["id"] for n in plan["nodes"]], graph_edges(plan))
    return max(1400, int(graph_w) + 90), int(420 + graph_h + 40 * (len(plan["edges"]) + len(plan["nodes"])))


def _chromium() -> Optional[str]:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


def screenshot(html_path: str, png_path: str, height: int = 1600, width: int = 1400) -> Optional[str]:
    """Render the page to ``png_path`` with headless Chromium; None on success, else why not."""
    browser = _chromium()
    if browser is None:
        return "no chromium on PATH (install chromium, or open the HTML page)"
    with tempfile.TemporaryDirectory() as profile:
        cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               f"--user-data-dir={profile}", f"--screenshot={os.path.abspath(png_path)}",
               f"--window-size={width},{height}", "file://" + os.path.abspath(html_path)]
        try:
            subprocess.run(cmd, capture_output=True, timeout=120, check=True)
        except (OSError, subprocess.SubprocessError) as err:
            return f"chromium failed: {type(err).__name__}"
    return None if os.path.isfile(png_path) else "chromium wrote no file"
