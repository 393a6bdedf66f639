"""The spec's examples type-check under mypy --strict with our stubs."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def test_spec_examples_pass_mypy_strict():
    pytest.importorskip("mypy")
    here = Path(__file__).parent / "typing"
    r = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                        str(here / "spec_examples.py")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
