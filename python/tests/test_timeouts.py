"""Timeouts and Cancel from Python: a sync that expires raises
DeadlineExceededError (gRPC DEADLINE_EXCEEDED) while the work goes on,
cancel() stops it, and a later sync reports the cancelled launches."""
import grpc
import numpy as np
import pytest

import fusebox
from fusebox._proto import pb

# each launch runs a serial loop of n steps; thousands of them outlast any
# short timeout on any machine, and cancel() makes the test end at once
SPIN = """
layout { place x: f64, done: i64 }
kernel spin(n: i32) {
  var k = 0
  while k < n {
    x[] = x[] * 0.999 + 1.0
    k += 1
  }
  done[] += 1
}
"""
LAUNCHES = 4000


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_sync_timeout_then_cancel(fb, mode):
    with fb.session(SPIN, mode=mode) as s:
        for _ in range(LAUNCHES):
            s.kernels.spin(200000)
        with pytest.raises(fusebox.DeadlineExceededError) as e:
            s.sync(timeout=0.05)
        assert e.value.status == grpc.StatusCode.DEADLINE_EXCEEDED
        assert isinstance(e.value, TimeoutError) and isinstance(e.value, fusebox.ServerError)
        assert "not answered within 0.05 s" in str(e.value) and "cancel()" in str(e.value)
        s.cancel()
        with pytest.raises(fusebox.LaunchError) as e:
            s.sync()
        errs = e.value.errors
        assert errs and all(f.code == -14 and f.kernel == "spin" for f in errs)
        skipped = len(errs) + e.value.dropped
        done = int(s.fields.done.to_numpy())
        assert 0 < skipped and done < LAUNCHES
        if mode == "sync":  # one error per skipped launch (async: per flushed window)
            assert done + skipped == LAUNCHES
        # the session goes on
        s.kernels.spin(1)
        assert s.sync(timeout=60).seq == LAUNCHES + 1
        assert int(s.fields.done.to_numpy()) == done + 1


def test_session_default_timeout_and_return_values(fb):
    src = SPIN + "kernel get() -> i64 { return done[] }\n"
    with fb.session(src, timeout=0.05) as s:
        for _ in range(LAUNCHES):
            s.kernels.spin(200000)
        with pytest.raises(fusebox.DeadlineExceededError):
            s.kernels.get()  # a return value waits under the session's timeout
        with pytest.raises(fusebox.DeadlineExceededError):
            s.fields.x.to_numpy()  # so does the sync before a read
        s.cancel()
        with pytest.raises(fusebox.LaunchError):
            s.sync(timeout=60)
        assert s.kernels.get() == int(s.fields.done.to_numpy())


def test_call_timeouts(fb):
    with fb.session(SPIN) as s:
        for _ in range(LAUNCHES):
            s.kernels.spin(200000)
        with pytest.raises(fusebox.DeadlineExceededError):
            s.sync(timeout=0.05)
        # a call the server queues behind those launches: its deadline passes
        req = pb.RegisterKernelsRequest(session_id=s.id, source=s._src)
        with pytest.raises(fusebox.DeadlineExceededError) as e:
            fb._call("RegisterKernels", req, timeout=0.05)
        assert e.value.status == grpc.StatusCode.DEADLINE_EXCEEDED
        assert e.value.method == "RegisterKernels" and "DEADLINE_EXCEEDED" in str(e.value)
        with pytest.raises(fusebox.DeadlineExceededError):
            s.fields.x.to_numpy(timeout=0.05)  # its sync first, under the same timeout
        assert s.cancel() >= 0
        with pytest.raises(fusebox.LaunchError):
            s.sync()
        s.fields.x.from_numpy(np.float64(1.0), timeout=30)
        assert s.fields.x.to_numpy(timeout=30) == 1.0
        assert fb.info(timeout=30).version
