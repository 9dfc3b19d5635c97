"""fusebox.bench (over the fusebox command line) and fusebox.plot."""
import json

import numpy as np
import pytest

import fusebox
from conftest import EXAMPLES, FUSEBOX_CLI


@pytest.fixture
def cli(monkeypatch):
    monkeypatch.setenv("FUSEBOX_CLI", FUSEBOX_CLI)


def test_bench_rows(cli, fb):
    for where in ({"local": True}, {"server": fb}):
        rows = fusebox.bench(f"{EXAMPLES}/heat.json", modes=["sync", "async"], warmup=0,
                             repeat=1, **where)
        assert [(r["case"], r["mode"]) for r in rows] == [("heat", "sync"), ("heat", "async")]
        for r in rows:
            assert r["checks_passed"] is True  # heat is conserved however many steps
            assert r["tasks_launched"] > 0 and r["wall_s"] > 0


def test_bench_failure(cli, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "bad", "program": "nope.fbk", "step": []}))
    with pytest.raises(fusebox.Error, match="nope.fbk"):
        fusebox.bench(str(bad), local=True)


def test_plot(fb):
    with fb.session(file=f"{EXAMPLES}/heat.fbk") as s:
        s.kernels.init()
        with pytest.raises(ValueError, match="shape \\(3,\\); plot shows 2-D"):
            fusebox.plot(np.zeros(3))
        try:
            import matplotlib
            matplotlib.use("Agg")
        except ImportError:
            with pytest.raises(ImportError, match="needs matplotlib"):
                fusebox.plot(s.fields.T)
            return
        im = fusebox.plot(s.fields.T)
        assert im.get_array().shape == (64, 64) and im.axes.get_title() == "T"
