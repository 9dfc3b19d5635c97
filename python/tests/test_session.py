"""The fusebox package against a real fuseboxd: connecting, sessions,
kernels as callables, fields as NumPy, errors; and the same results as
`fusebox run` on the examples."""
import json
import os
import signal
import subprocess

import grpc
import numpy as np
import pytest

import fusebox
from conftest import EXAMPLES, FUSEBOX_CLI, FUSEBOXD, example

VEC = """
layout {
  dense(ij: 3, 5) { place v: f64[2], m: f32[2][2] }
  dense(i: ${N}) { place n: i32, x: f64 }
  place total: i64
}
kernel fill(s: f64) { for i, j in v { v[i, j] = [s * f64(i), s * f64(j)] } }
kernel scale(a: i32) { for i in n { n[i] = n[i] * a } }
kernel sum() -> i64 {
  total[] = 0
  for i in n { total[] += n[i] }
  return total[]
}
kernel oob(k: i32) { n[k] = 1 }
kernel typed(a: i64, b: u32, c: u64, d: bool, e: f64) -> f64 {
  return a + b + c + (d ? 1 : 0) + e
}
kernel copy(A: field, B: field) { for i in A { B[i] = A[i] } }
"""


# ------------------------------------------------------------------ connect

def test_connect_private_server_and_info(fb):
    info = fb.info()
    assert info.version and info.backend in ("cpu", "cuda")
    assert info.listen and info.listen[0].startswith("unix:")
    assert fb.address.startswith("unix:") and fb._daemon.proc.poll() is None


def test_connect_to_address_with_token(server):
    with fusebox.connect(server.address, token="t0ken") as c:
        assert c.info().max_message_bytes > 0
        assert float(c.stats()["uptime_s"]) > 0


def test_connect_missing_binary(monkeypatch, tmp_path):
    monkeypatch.setenv("FUSEBOXD", str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="FUSEBOXD"):
        fusebox.connect()
    monkeypatch.delenv("FUSEBOXD")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(fusebox.client.os, "listdir", lambda d: [])
    with pytest.raises(FileNotFoundError, match="no fuseboxd to start"):
        fusebox.connect()


def test_connect_to_nothing_fails(tmp_path):
    with pytest.raises(fusebox.ConnectionLostError) as e:
        fusebox.connect("unix:" + str(tmp_path / "none.sock"), timeout=10)
    assert e.value.status == grpc.StatusCode.UNAVAILABLE


def test_connect_arguments_checked(server):
    with pytest.raises(TypeError, match="private server"):
        fusebox.connect(server.address, fuseboxd="/bin/true")
    with pytest.raises(TypeError, match="tls"):
        fusebox.connect(server.address, tls=3.5)


# ------------------------------------------------------------------ describe, kernels

def test_describe(fb):
    p = fb.describe(VEC, params={"N": 7}, filename="vec.fbk")
    v, m, n, t = p.fields["v"], p.fields["m"], p.fields["n"], p.fields["total"]
    assert (v.shape, v.dtype, v.element_shape) == ((3, 5, 2), np.float64, (2,))
    assert (m.shape, m.dtype) == ((3, 5, 2, 2), np.float32) and len(m.places) == 4
    assert (n.shape, n.dtype) == ((7,), np.int32)
    assert (t.shape, t.dtype) == ((), np.int64)
    assert p.kernels["copy"].signature == "copy(A: field, B: field)"
    assert p.kernels["typed"].signature == "typed(a: i64, b: u32, c: u64, d: bool, e: f64) -> f64"
    assert p.kernels["sum"].ret == "i64"


def test_kernels_bind_and_return(fb):
    with fb.session(VEC, params={"N": 10}, mode="async") as s:
        s.fields.n[:] = np.arange(10, dtype=np.int32)
        s.kernels.scale(a=3)
        s.launch("scale", 2)
        assert s.kernels.sum() == 6 * 45
        assert s.launch("sum") == 270
        assert s.kernels.typed(-5, 7, 2**64 - 1 - 2**40, True, 0.25) == \
            -5 + 7 + float(2**64 - 1 - 2**40) + 1 + 0.25
        r = s.sync()
        assert isinstance(r.counters, fusebox.Counters) and r.counters.launches >= 4


def test_field_parameters(fb):
    with fb.session(VEC, params={"N": 4}) as s:
        s.fields.n[:] = [1, 2, 3, 4]
        s.kernels.copy(s.fields.n, s.fields.n)  # same field: reads then writes itself
        assert s.fields.n.to_numpy().tolist() == [1, 2, 3, 4]
        with pytest.raises(fusebox.ServerError) as e:
            s.kernels.copy("n", "nosuch")
        assert e.value.status == grpc.StatusCode.NOT_FOUND and "copy" in e.value.message
        with pytest.raises(TypeError, match="'A' \\(field\\) must be a field"):
            s.kernels.copy(1, "n")


def test_bad_kernel_calls(fb):
    with fb.session(VEC, params={"N": 4}) as s:
        with pytest.raises(fusebox.NotFoundError, match="no kernel 'nope'.*fill"):
            s.kernels.nope()
        with pytest.raises(fusebox.NotFoundError, match="no kernel 'nope'"):
            s.launch("nope", 1)
        with pytest.raises(TypeError, match=r"scale\(a: i32\) takes 1 argument but 2"):
            s.kernels.scale(1, 2)
        with pytest.raises(TypeError, match="missing argument 'a'"):
            s.kernels.scale()
        with pytest.raises(TypeError, match="no parameter 'b'"):
            s.kernels.scale(b=1)
        with pytest.raises(TypeError, match="two values for 'a'"):
            s.kernels.scale(1, a=1)
        with pytest.raises(TypeError, match="argument 'a' \\(i32\\) must be an int, not str"):
            s.kernels.scale("2")
        with pytest.raises(TypeError, match="argument 'a' \\(i32\\) must be an int, not float"):
            s.kernels.scale(2.5)
        with pytest.raises(ValueError, match="argument 'a' \\(i32\\): 2147483648 is out of"):
            s.kernels.scale(2**31)
        with pytest.raises(TypeError, match="argument 's' \\(f64\\) must be a number"):
            s.kernels.fill(None)
        with pytest.raises(ValueError, match="'b' \\(u32\\): -1 is out of range"):
            s.kernels.typed(1, -1, 1, True, 1.0)
        # nothing of the refused calls reached the server
        assert s.sync().counters.launches == 0


def test_launch_error_reported_at_sync(fb):
    with fb.session(VEC, params={"N": 4}, mode="sync") as s:
        s.kernels.oob(2)
        s.kernels.oob(99)
        with pytest.raises(fusebox.LaunchError) as e:
            s.sync()
        f = e.value.errors[0]
        assert f.seq == 2 and f.kernel == "oob" and f.code == -9
        assert "oob" in str(e.value)
        s.kernels.oob(1)  # the session goes on
        s.sync()
        assert s.fields.n.to_numpy().tolist() == [0, 1, 1, 0]


# ------------------------------------------------------------------ fields

def test_fields_numpy(fb):
    with fb.session(VEC, params={"N": 6}) as s:
        v = s.fields.v
        assert v.shape == (3, 5, 2) and v.dtype == np.float64 and len(v) == 3
        s.kernels.fill(0.5)
        a = v.to_numpy()
        i, j = np.meshgrid(np.arange(3), np.arange(5), indexing="ij")
        assert np.array_equal(a, np.stack([0.5 * i, 0.5 * j], axis=-1))
        m = np.random.default_rng(1).random((3, 5, 2, 2)).astype(np.float32)
        s.fields.m.from_numpy(m)
        assert np.array_equal(s.fields.m.to_numpy(), m)
        s.fields.x[:] = np.linspace(0, 1, 6)          # float64 -> f64
        s.fields.n[:] = np.arange(6, dtype=np.int64)  # int64 -> i32 (same kind)
        s.fields.n[2] = 40                            # one element (read-modify-write)
        assert s.fields.n[2] == 40 and s.fields.n.to_numpy().sum() == 53
        s.fields.n.fill(7)
        assert s.fields.n.to_numpy().tolist() == [7] * 6
        s.fields.total[:] = 2**40
        assert s.fields.total.to_numpy() == 2**40 and s.fields.total.shape == ()
        s.fields.x = np.ones(6)                       # assignment through the namespace
        assert np.asarray(s.fields.x).sum() == 6.0


def test_field_errors(fb):
    with fb.session(VEC, params={"N": 6}) as s:
        with pytest.raises(ValueError, match=r"field 'n' has shape \(6,\); the array's shape "
                                             r"is \(5,\)"):
            s.fields.n[:] = np.zeros(5, dtype=np.int32)
        with pytest.raises(TypeError, match=r"field 'n' holds i32 \(int32\); an array of "
                                            r"float64 does not convert"):
            s.fields.n[:] = np.zeros(6)
        with pytest.raises(TypeError, match="complex128"):
            s.fields.x[:] = np.zeros(6, dtype=complex)
        with pytest.raises(TypeError, match="<U1"):
            s.fields.x[:] = np.array(["a"] * 6)
        with pytest.raises(fusebox.NotFoundError, match="no field 'y'"):
            s.fields.y.to_numpy()
        assert "v" in s.fields and len(s.fields) == 5


def test_large_field_chunked(fb):
    src = "layout { dense(ij: 1500, 1000) { place big: f32 } }\n" \
          "kernel bump() { for i, j in big { big[i, j] += 1.0 } }\n"
    with fb.session(src, mode="async") as s:
        a = np.random.default_rng(2).random((1500, 1000), dtype=np.float32)
        assert a.nbytes > 4 << 20  # more than one message can hold
        s.fields.big[:] = a
        s.kernels.bump()
        assert np.array_equal(s.fields.big.to_numpy(progress=True), a + np.float32(1))


# ------------------------------------------------------------------ the server's errors

def test_parse_error_has_position(fb):
    bad = "layout { dense(i: 4) { place x: f32 } }\nkernel k() { x[0] = y }\n"
    with pytest.raises(fusebox.ServerError) as e:
        fb.session(bad, filename="bad.fbk")
    assert e.value.status == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.fb_code == -4
    assert "bad.fbk:2:21: error: undefined variable 'y'" in e.value.message


def test_params(fb):
    with pytest.raises(fusebox.ServerError, match=r"\$\{N\} is not a parameter"):
        fb.session(VEC)
    with fb.session(VEC, params={"N": 3}) as s:
        assert s.fields.n.shape == (3,)


def test_session_options(fb):
    with pytest.raises(ValueError, match="unknown pass 'fuse'"):
        fb.session(VEC, params={"N": 2}, passes=["fuse"])
    with fb.session(VEC, params={"N": 2}, mode="async", passes={"fusion": False},
                    flush_every=4, seed=3) as s:
        for _ in range(10):
            s.kernels.scale(2)
        s.flush()
        c = s.counters()
        assert c.launches == 10 and c.tasks_fused == 0 and c.flushes >= 2
    with pytest.raises(fusebox.ServerError, match="unknown backend 'tpu'"):
        fb.session(VEC, params={"N": 2}, backend="tpu")


def test_closed_session(fb):
    with fb.session(VEC, params={"N": 2}) as s:
        pass
    with pytest.raises(fusebox.Error, match="closed"):
        s.kernels.scale(1)
    with pytest.raises(fusebox.Error, match="closed"):
        s.fields.n.to_numpy()
    st = fb.stats()
    assert int(st.get("sessions_closed", 0)) >= 1 and int(st.get("sessions_active", 0)) == 0


def test_server_gone(server):
    c = fusebox.connect(server.address, timeout=20)
    assert c.ready() is True
    s = c.session(VEC, params={"N": 2})
    s.kernels.scale(2)
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait()
    with pytest.raises(fusebox.ConnectionLostError) as e:
        s.sync()
    assert e.value.status == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(fusebox.ConnectionLostError):
        c.info()
    assert c.ready(timeout=5) is False
    c.close()
    assert c.ready() is False


# ------------------------------------------------------------------ as `fusebox run`

def run_cli(tmp_path, fbk, setup, step, reads, mode):
    sess = {"name": "py", "program": os.path.join(EXAMPLES, fbk),
            "session": {"mode": mode, "seed": 1}, "setup": setup, "step": step,
            # names relative to the session file's folder (tmp_path): outputs stay inside it
            "checks": [{"read": f, "to": f"{f}.npy"} for f in reads]}
    p = tmp_path / "s.json"
    p.write_text(json.dumps(sess))
    r = subprocess.run([FUSEBOX_CLI, "run", str(p), "-q"], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "FUSEBOXD": FUSEBOXD})
    assert r.returncode == 0, r.stdout + r.stderr
    return {f: np.load(tmp_path / f"{f}.npy") for f in reads}


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_heat_as_fusebox_run(fb, tmp_path, mode):
    steps = [{"repeat": 50, "do": [{"launch": "step", "args": ["T", "U", 0.2]},
                                   {"launch": "step", "args": ["U", "T", 0.2]}]}]
    want = run_cli(tmp_path, "heat.fbk", [{"launch": "init"}], steps, ["T", "U"], "sync")
    with fb.session(example("heat.fbk"), filename="heat.fbk", mode=mode) as s:
        s.kernels.init()
        T, U = s.fields.T, s.fields.U
        for _ in range(50):
            s.kernels.step(T, U, k=0.2)
            s.kernels.step(U, T, 0.2)
        assert np.array_equal(T.to_numpy(), want["T"])
        assert np.array_equal(U.to_numpy(), want["U"])
        assert abs(float(T.to_numpy().sum()) - 19300.0) < 19300.0 * 1e-4


def test_life_as_fusebox_run(fb, tmp_path):
    steps = [{"repeat": 16, "do": [{"launch": "step", "args": ["a", "b"]},
                                   {"launch": "step", "args": ["b", "a"]}]}]
    want = run_cli(tmp_path, "life.fbk", [{"launch": "seed"}], steps, ["a"], "sync")
    with fb.session(example("life.fbk"), mode="async") as s:
        s.kernels.seed()
        for _ in range(16):
            s.kernels.step("a", "b")
            s.kernels.step("b", "a")
        assert s.kernels.count() == 8
        assert np.array_equal(s.fields.a.to_numpy(), want["a"])


def test_sparse_field_reads_whole_extent(fb):
    with fb.session(example("sparse.fbk")) as s:
        s.kernels.paint()  # rho[i, i + d] = 1 + d for d < 3 inside 128 x 128
        r = s.fields.rho.to_numpy()
        assert r.shape == (128, 128) and r.dtype == np.float32
        i, j = np.nonzero(r)
        assert len(i) == 128 + 127 + 126 and set(j - i) == {0, 1, 2}
        assert np.array_equal(r[i, j], 1.0 + (j - i))


def test_deactivate_dense_field_error_in_user_terms(fb):
    # the package adds a kernel of its own for deactivate; a mistake in the
    # request is reported about the field, never with that kernel's name or IR
    src = ("layout {\n  dense(i: 8) { place x: f32 }\n"
           "  pointer(i: 8) { place y: f32 }\n}\n"
           "kernel put() { y[3] = 1.0 }\n")
    with fb.session(src) as s:
        with pytest.raises(fusebox.ServerError) as ei:
            s.fields.x.deactivate([[3]])
        msg = str(ei.value)
        assert "deactivate on field 'x'" in msg and "dense SNode" in msg, msg
        assert "__fbpy_" not in msg and "%" not in msg and "verification" not in msg, msg
        s.kernels.put()  # the session goes on; a sparse field deactivates
        s.fields.y.deactivate([[3]])
        assert s.fields.y.to_numpy()[3] == 0.0


def test_counters_since(fb):
    with fb.session(example("heat.fbk"), mode="async", flush_every=4) as s:
        s.kernels.init()
        before = s.counters()
        for _ in range(10):
            s.kernels.step("T", "U", 0.2)
            s.kernels.step("U", "T", 0.2)
        after = s.counters()
        d = after.since(before)
        assert d.launches == 20 and d.flushes >= 5 and d.tasks_launched > 0
        assert d.device_bytes == after.device_bytes and d.optimizer_s >= 0
        assert after.fuse_refused >= 0 and isinstance(after.fuse_fallbacks, int)
        # the same four-launch window again and again: the plan memo answers it
        assert d.plans_reused > 0 and d.plans_reused <= d.flushes
