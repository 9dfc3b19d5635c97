"""A private server's compile cache on disk (docs/code-cache.md,
docs/python.md): connect() twice under one XDG_CACHE_HOME, and the second
server compiles nothing; FUSEBOX_CODE_CACHE_DIR="" turns it off; a
directory named in server_args wins."""
import os

import fusebox

SRC = """layout { dense(i: 32) { place x: i32 } }
kernel fill(k: i32) { for i in x { x[i] = i * k + 1 } }
kernel twice() { for i in x { x[i] = x[i] * 2 } }
"""


def _round():
    with fusebox.connect() as c:
        with c.session(SRC, mode="sync") as s:
            s.kernels.fill(5)
            s.kernels.twice()
            r = s.sync()
            assert list(s.fields.x[:]) == [(i * 5 + 1) * 2 for i in range(32)]
            return r.counters


def test_private_server_cache_default(fuseboxd, tmp_path, monkeypatch):
    monkeypatch.delenv("FUSEBOX_CODE_CACHE_DIR", raising=False)
    xdg = tmp_path / "xdg-not-made-yet"
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    first = _round()
    assert first.tasks_compiled >= 2, first
    assert (xdg / "fusebox").is_dir() and (xdg / "fusebox.key").is_file()
    assert oct(os.stat(xdg / "fusebox").st_mode & 0o777) == "0o700"
    second = _round()  # a new private server: every task from disk
    assert second.tasks_compiled == 0 and second.cache_hits == first.tasks_compiled, second


def test_private_server_cache_off_and_elsewhere(fuseboxd, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("FUSEBOX_CODE_CACHE_DIR", "")
    assert _round().tasks_compiled >= 2
    assert _round().tasks_compiled >= 2  # no cache: compiled again
    assert not (tmp_path / "xdg").exists()
    monkeypatch.setenv("FUSEBOX_CODE_CACHE_DIR", str(tmp_path / "mine"))
    _round()
    assert _round().tasks_compiled == 0
    assert (tmp_path / "mine").is_dir()
    with fusebox.connect(server_args=["--code-cache-dir", str(tmp_path / "args")]) as c:
        with c.session(SRC) as s:
            s.kernels.fill(1)
            s.sync()
    assert (tmp_path / "args").is_dir()
