"""Sphinx configuration of the vtc-tvm documentation.

Build:  .venv/bin/python -m sphinx -b html -W docs docs/_build/html   (needs the ``docs`` extra)

The tutorials (``../tutorials/*.py``) are executed by sphinx-gallery and rendered as pages with
their output; the op coverage table is generated from the rule registry (``_ext/vtc_op_table``).
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "_ext"))
if os.path.isdir(os.path.join(HERE, "..", "python", "vtc_tvm")):  # a source checkout: document this copy
    sys.path.insert(0, os.path.join(HERE, "..", "python"))


project = "vtc-tvm"
author = "vtc-tvm developers"
copyright = "2026, vtc-tvm developers"
release = "0.1.0"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx_gallery.gen_gallery",
    "vtc_op_table",
]
exclude_patterns = ["_build", "_generated/*.rst.txt"]
html_theme = "alabaster"
html_theme_options = {"description": "Virtual tensors for Apache TVM Relax", "page_width": "1100px"}
autodoc_member_order = "bysource"

sphinx_gallery_conf = {
    "examples_dirs": os.path.join(HERE, "..", "tutorials"),
    "gallery_dirs": "tutorials",  # generated, relative to this folder
    "filename_pattern": r"/\d\d_",  # execute every numbered tutorial
    "within_subsection_order": "sphinx_gallery.sorting.FileNameSortKey",
    "abort_on_example_error": True,
    "download_all_examples": False,
    "show_memory": False,
    "image_scrapers": (),  # the tutorials print, they do not plot (no matplotlib needed)
    "reset_modules": (),
    "min_reported_time": 3600,  # no per-cell timings in the pages
    "reference_url": {"vtc_tvm": None},
}
