"""CUDA session workers as the first GPU run would meet them (issue 42,
docs/gpu.md "Known before the first run"), through a real fuseboxd with the
fake CUDA driver (FB_CUDA_LIBRARY) on a unix socket:

- libdevice under process isolation: a worker's root is an empty read-only
  directory once its walls are up, so it reads libdevice into memory while
  its engine is made; kernels calling sin/cos/exp then compile in every
  isolation mode.
- without libdevice (FB_LIBDEVICE naming a file that does not exist) the
  error names the kernel and the math function, never an IR value (%7).
- sparse sessions (pointer, bitmasked, dynamic) open in both isolation
  modes: the block pool is reserved in device memory within the session's
  limit and the device budget.

The fake driver runs no kernel: what is observable is that registration
compiles (the PTX has libdevice's code linked in, else registration fails)
and that sessions open, launch and round-trip their fields."""
import json
import os
import re
import subprocess
import tempfile

import pytest

from conftest import BUILD, pb, snode

FAKE_CUDA = os.path.abspath(os.path.join(BUILD, "tests", "fakecuda", "libfakecuda.so"))
FUSEBOX = os.path.join(BUILD, "client", "fusebox")
EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
LIBDEVICE = [os.path.join(h, "nvvm/libdevice/libdevice.10.bc")
             for h in (os.environ.get("CUDA_HOME", ""), "/usr/local/cuda") if h]
HAVE_LIBDEVICE = any(os.path.exists(p) for p in LIBDEVICE)
MODES = ["process", "thread"]

MATH_FBK = """layout {
  dense(i: 64) { place a: f32 }
  dense(i: 64) { place b: f32 }
  dense(i: 64) { place c: f64 }
}
kernel waves(t: f32) {
  for i in 0 .. 64 {
    a[i] = sin(f32(i) * t) + cos(t)
    b[i] = exp(-f32(i) * t)
    c[i] = f64(a[i]) % 0.25
  }
}
"""


def _cuda(monkeypatch, **env):
    if not os.path.exists(FAKE_CUDA):
        pytest.fail(f"the fake CUDA driver is not built ({FAKE_CUDA})")
    monkeypatch.setenv("FB_CUDA_LIBRARY", FAKE_CUDA)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return ("--backend", "cuda")


def _run(server, program, mode="sync"):
    """fusebox run PROGRAM.json against server: the JSON report."""
    with tempfile.TemporaryDirectory(prefix="fbcw-") as out:
        p = subprocess.run([FUSEBOX, "run", program, "--server", "unix:" + server.sock, "--mode",
                            mode, "--json", "-q", "-o", out],
                           capture_output=True, text=True, timeout=120)
    text = p.stdout + p.stderr
    try:
        return json.loads(p.stdout), text
    except ValueError:
        raise AssertionError("fusebox run printed no report:\n" + text)


def _math_program(tmp):
    with open(os.path.join(tmp, "math.fbk"), "w") as f:
        f.write(MATH_FBK)
    prog = os.path.join(tmp, "math.json")
    with open(prog, "w") as f:
        json.dump({"name": "math", "program": "math.fbk",
                   "session": {"backend": "cuda", "mode": "sync", "seed": 1},
                   "setup": [{"launch": "waves", "args": [0.5]}],
                   "step": [{"launch": "waves", "args": [0.25]}],
                   "checks": []}, f)
    return prog


@pytest.mark.skipif(not HAVE_LIBDEVICE, reason="needs CUDA's libdevice.10.bc on this machine")
@pytest.mark.parametrize("isolation", MODES)
def test_math_compiles_in_every_isolation(make_server, monkeypatch, tmp_path, isolation):
    """sin, cos, exp and % on floats (fmod) compile for the GPU in a
    process-isolated worker, whose file system is empty once it serves."""
    server = make_server("--isolation", isolation, *_cuda(monkeypatch))
    rep, text = _run(server, _math_program(str(tmp_path)))
    assert rep.get("outcome") == "passed" and rep.get("backend") == "cuda", text
    assert "libdevice" not in text, text
    server.assert_unharmed()


@pytest.mark.skipif(not HAVE_LIBDEVICE, reason="needs CUDA's libdevice.10.bc on this machine")
def test_examples_with_math_compile(make_server, monkeypatch):
    """examples/wave and examples/deform (exp, sin, sqrt) run their
    sessions under process isolation (their checks cannot pass: the fake
    runs no kernel)."""
    server = make_server(*_cuda(monkeypatch))
    for ex in ("wave", "deform"):
        rep, text = _run(server, os.path.join(EXAMPLES, ex + ".json"))
        assert rep.get("outcome") in ("passed", "failed") and rep.get("backend") == "cuda", text
        assert not rep.get("error"), text
    server.assert_unharmed()


@pytest.mark.parametrize("isolation", MODES)
def test_missing_libdevice_names_kernel_and_function(make_server, monkeypatch, tmp_path,
                                                     isolation):
    """No libdevice: the error says which kernel uses which function, where
    libdevice was looked for and what to set, with no IR value (%N)."""
    missing = str(tmp_path / "nowhere" / "libdevice.10.bc")
    server = make_server("--isolation", isolation, *_cuda(monkeypatch, FB_LIBDEVICE=missing))
    rep, text = _run(server, _math_program(str(tmp_path)))
    err = rep.get("error") or ""
    assert rep.get("outcome") == "error", text
    assert re.search(r"kernel 'waves' uses (sin|cos|exp)\(\)", err), err
    assert "libdevice" in err and missing in err and "CUDA_HOME" in err, err
    assert not re.search(r"%\d", err), err
    server.assert_unharmed()


def _pointer_layout():
    """pointer(i: 16) { dense(i: 8) { place p: i32 } }"""
    return pb.Layout(nodes=[snode(pb.SN_ROOT, -1),
                            snode(pb.SN_POINTER, 0, axes=1, size=(16, 1, 1, 1)),
                            snode(pb.SN_DENSE, 1, axes=1, size=(8, 1, 1, 1)),
                            snode(pb.SN_PLACE, 2, name="p", type=pb.T_I32)])


def _bitmasked_layout():
    """bitmasked(i: 128) { place m: f32 }"""
    return pb.Layout(nodes=[snode(pb.SN_ROOT, -1),
                            snode(pb.SN_BITMASKED, 0, axes=1, size=(128, 1, 1, 1)),
                            snode(pb.SN_PLACE, 1, name="m", type=pb.T_F32)])


@pytest.mark.parametrize("isolation", MODES)
def test_sparse_sessions_open(make_server, monkeypatch, isolation):
    """Pointer and bitmasked sessions open on the CUDA backend through
    fuseboxd (their block pools in device memory) and round-trip their
    fields; examples/sparse (pointer, bitmasked, dynamic) runs its session
    in both modes of execution."""
    server = make_server("--isolation", isolation, *_cuda(monkeypatch))
    c = server.client
    for layout, field in ((_pointer_layout(), 3), (_bitmasked_layout(), 2)):
        sid = c.new_session(layout)
        n = 128 * 4
        # cells written with nonzero values become active; zeros stay zero
        data = bytes((i * 7 + 1) % 256 if (i // 4) % 3 else 0 for i in range(n))
        assert c.write_field(sid, field, data) == n
        assert c.read_field(sid, field) == data
    for mode in ("sync", "async"):
        rep, text = _run(server, os.path.join(EXAMPLES, "sparse.json"), mode)
        assert rep.get("outcome") in ("passed", "failed") and rep.get("backend") == "cuda", text
        assert not rep.get("error") and "sparse block pool" not in text, text
    server.assert_unharmed()
