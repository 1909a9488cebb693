"""The tutorials run as users run them (each checks its own numbers)."""

import pathlib
import subprocess
import sys

import pytest

TUTORIALS = sorted((pathlib.Path(__file__).parents[1] / "tutorials").glob("*.py"))


@pytest.mark.parametrize("path", TUTORIALS, ids=lambda p: p.stem)
def test_tutorial_runs(path):
    r = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_tutorials_exist():
    assert len(TUTORIALS) >= 2
