"""Sphinx extension: the op coverage table, generated from vtc_tvm's rule registry at build time.

At ``builder-inited`` it writes ``_generated/op_table.rst`` (included by ``ops.rst``): one row
per op in :func:`vtc_tvm.registered_ops`, with the rule that handles it, the first line of that
rule's docstring, and the ONNX ops that TVM's importer turns into it. A rule registered by
vtc_tvm (or by a user, before the build) appears without editing any page.
"""

from __future__ import annotations

import inspect
import os

# ONNX op -> the Relax op ``relax.frontend.onnx.from_onnx`` emits for it (TVM 0.27); only the
# ops that have a rule are shown, so this list never claims coverage the registry lacks.
ONNX_IMPORTS = {
    "relax.permute_dims": ["Transpose"],
    "relax.reshape": ["Reshape", "Flatten"],
    "relax.squeeze": ["Squeeze"],
    "relax.expand_dims": ["Unsqueeze"],
    "relax.strided_slice": ["Slice"],
    "relax.split": ["Split"],
    "relax.concat": ["Concat"],
    "relax.broadcast_to": ["Expand"],
    "relax.tile": ["Tile"],
    "relax.nn.pad": ["Pad"],
    "relax.take": ["Gather"],
    "relax.gather_elements": ["GatherElements"],
    "relax.gather_nd": ["GatherND"],
}


def _summary(fn) -> str:
    doc = inspect.getdoc(fn) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def op_table_rst() -> str:
    """The table as reStructuredText (a ``list-table``)."""
    import vtc_tvm
    from vtc_tvm.rules import get_rule

    ops = vtc_tvm.registered_ops()
    lines = [f".. list-table:: {len(ops)} Relax ops with a load-side rule (generated from the registry)",
             "   :header-rows: 1", "   :widths: 25 25 15 35", "",
             "   * - Relax op", "     - rule (in ``vtc_tvm.rules`` unless named)", "     - from ONNX",
             "     - what the rule maps"]
    for op in ops:
        fn = get_rule(op)
        where = fn.__qualname__ if fn.__module__ == "vtc_tvm.rules" else f"{fn.__module__}.{fn.__qualname__}"
        onnx = ", ".join(f"``{o}``" for o in ONNX_IMPORTS.get(op, [])) or "\u2014"
        lines += [f"   * - ``{op}``", f"     - ``{where}``", f"     - {onnx}",
                  f"     - {_escape(_summary(fn)) or chr(0x2014)}"]
    return "\n".join(lines) + "\n"


def _escape(text: str) -> str:
    """Plain-text formulas (``c*r*r``, ``a|b``) as literal characters, not RST markup."""
    return text.replace("*", "\\*").replace("|", "\\|")


def _write(app):
    out = os.path.join(app.srcdir, "_generated")
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "op_table.rst.txt")
    text = op_table_rst()
    if not os.path.isfile(path) or open(path).read() != text:  # rewrite only on change (incremental builds)
        with open(path, "w") as f:
            f.write(text)


def setup(app):
    # Before sphinx-gallery's handler (priority 500), which runs the tutorials in this process:
    # tutorial 2 overrides a rule, and the table shows the installed rules, not the tutorial's.
    app.connect("builder-inited", _write, priority=400)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
