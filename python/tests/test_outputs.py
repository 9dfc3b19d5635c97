"""Files a session names stay inside its folder when the package runs it:
fusebox.bench writes the checks' `read ... to` files beside the JSON file
(through the fusebox command line), and a shared session file must not
reach anything outside that folder (issue 38, attack 5)."""
import json
import os

import numpy as np
import pytest

import fusebox
from conftest import FUSEBOX_CLI

PROG = ("layout { dense(ij: 3, 5) { place u: f32 } }\n"
        "kernel init() { for i, j in u { u[i, j] = f32(i * 5 + j) } }\n")


@pytest.fixture
def cli(monkeypatch):
    monkeypatch.setenv("FUSEBOX_CLI", FUSEBOX_CLI)


@pytest.fixture
def sess(tmp_path):
    """A session folder inside tmp_path, and a victim file beside it."""
    d = tmp_path / "sess"
    d.mkdir()
    (d / "p.fbk").write_text(PROG)
    victim = tmp_path / "victim.npy"
    victim.write_text("VICTIM")
    return d, victim


def bench_writing(d, to):
    f = d / "s.json"
    f.write_text(json.dumps({"name": "out", "program": "p.fbk",
                             "setup": [{"launch": "init"}],
                             "checks": [{"read": "u", "to": to}]}))
    return fusebox.bench(str(f), modes=["sync"], warmup=0, repeat=1, local=True)


@pytest.mark.parametrize("to,why", [
    ("ABS", "is an absolute path"),
    ("../victim.npy", "has a '..' component"),
    ("x/../../victim.npy", "has a '..' component"),
])
def test_names_that_leave_are_refused(cli, sess, to, why):
    d, victim = sess
    to = str(victim) if to == "ABS" else to
    with pytest.raises(fusebox.Error) as e:
        bench_writing(d, to)
    msg = str(e.value)
    assert f"$.checks[0].to: '{to}' {why}" in msg, msg
    assert "output names must stay inside the output directory" in msg, msg
    assert victim.read_text() == "VICTIM"


def test_link_to_a_folder_outside_is_not_followed(cli, sess, tmp_path):
    d, _ = sess
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "u.npy").write_text("OUTSIDE")
    os.symlink(outside, d / "link")
    with pytest.raises(fusebox.Error, match="'link' is a symbolic link"):
        bench_writing(d, "link/u.npy")
    assert (outside / "u.npy").read_text() == "OUTSIDE"
    with pytest.raises(fusebox.Error, match="'link' is a symbolic link"):
        bench_writing(d, "link/new/u.npy")
    assert sorted(os.listdir(outside)) == ["u.npy"]


def test_link_at_the_name_is_not_followed(cli, sess):
    d, victim = sess
    os.symlink(victim, d / "u.npy")
    with pytest.raises(fusebox.Error, match="'u.npy' is a symbolic link"):
        bench_writing(d, "u.npy")
    assert victim.read_text() == "VICTIM"
    assert os.path.islink(d / "u.npy")


def test_hard_link_is_not_overwritten(cli, sess):
    d, victim = sess
    os.link(victim, d / "h.npy")
    with pytest.raises(fusebox.Error, match="'h.npy' has other hard links"):
        bench_writing(d, "h.npy")
    assert victim.read_text() == "VICTIM"


def test_nested_names_work(cli, sess):
    d, _ = sess
    (d / "again.npy").write_text("OLD")
    for to in ("frames/sub/u.npy", "./again.npy"):
        rows = bench_writing(d, to)
        assert rows and rows[0]["checks_passed"] is True
        a = np.load(d / to)
        assert a.shape == (3, 5) and a[2, 4] == 14.0
