"""The examples type-check under mypy --strict with our stubs."""

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("example", ["spec_examples.py", "keyed_state_example.py",
                                     "generic_types_example.py",
                                     "request_example.py"])
def test_examples_pass_mypy_strict(example):
    # spec_examples.py: the spec's examples; keyed_state_example.py: keyed
    # state as the original's current API types it; generic_types_example.py:
    # payload and result types, and mistakes the stubs must catch;
    # request_example.py: the request result types (prosody.request) in use.
    pytest.importorskip("mypy")
    here = Path(__file__).parent / "typing"
    r = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                        str(here / example)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_package_itself_passes_mypy_strict(tmp_path):
    pytest.importorskip("mypy")
    # Run from elsewhere so the installed package (with its stubs) is checked.
    r = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                        "-p", "prosody"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
