"""python/examples run to completion against a private fuseboxd."""
import os
import subprocess
import sys

import pytest

from conftest import FUSEBOX_CLI, PYROOT, _LIB


@pytest.mark.parametrize("name,expect", [
    ("heat.py", "sync and async agree"),
    ("life.py", "after 256 generations: population 8"),
    ("notebook.py", "async  wall"),
    ("sparse.py", "after edits: 329 active cells (the kernel's count agrees)"),
])
def test_example(fuseboxd, tmp_path, name, expect):
    r = subprocess.run([sys.executable, os.path.join(PYROOT, "examples", name)],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": _LIB, "FUSEBOX_CLI": FUSEBOX_CLI},
                       cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert expect in r.stdout
    if name == "notebook.py":  # its picture, written without matplotlib
        assert (tmp_path / "heat.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
