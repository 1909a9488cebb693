"""The README's code cannot rot: every ```python block runs, in order, in one namespace, from the
repository root (on LLVM with a shipped small model). A block that needs a GPU (it says
``# needs a GPU`` or calls ``tvm.cuda(``) is skipped with the reason where none is visible."""

import contextlib
import os
import re

import pytest
import tvm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
BLOCKS = re.findall(r"^```python\n(.*?)^```", README, flags=re.S | re.M)
NAMESPACE: dict = {}


def _needs_gpu(code: str) -> bool:
    return "# needs a GPU" in code or "tvm.cuda(" in code


def test_readme_has_python_blocks():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_python_block(index, monkeypatch):
    code = BLOCKS[index]
    if _needs_gpu(code) and not tvm.cuda(0).exist:
        first = code.strip().splitlines()[0]
        pytest.skip(f"README python block {index + 1} ({first!r}) needs a GPU and none is visible")
    monkeypatch.chdir(ROOT)
    with contextlib.redirect_stdout(None):
        exec(compile(code, f"README.md python block {index + 1}", "exec"), NAMESPACE)  # noqa: S102


def test_readme_commands_exist():
    """Each ``vtc-tvm SUBCOMMAND`` the README shows is a subcommand of the parser."""
    from vtc_tvm import cli

    shown = set(re.findall(r"^vtc-tvm (\w+)", README, flags=re.M))
    choices = set(next(a for a in cli.parser()._actions if a.dest == "command").choices)
    assert shown and shown <= choices, shown - choices
