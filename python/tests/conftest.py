"""Fixtures of the fusebox package's tests: the package built from this
checkout (setup.py build_py, which runs protoc on proto/fusebox.proto, into
a temporary folder put first on sys.path) and real fuseboxd servers from the
build folder ($FB_BUILD_DIR, default build/), started per test on unix
sockets in temporary folders. Every server must exit 0 on SIGTERM at the
end (under AddressSanitizer that also means it leaked nothing).
"""
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYROOT = os.path.dirname(HERE)
ROOT = os.path.dirname(PYROOT)
BUILD = os.path.abspath(os.environ.get("FB_BUILD_DIR", os.path.join(ROOT, "build")))
FUSEBOXD = os.path.join(BUILD, "server", "fuseboxd")
FUSEBOX_CLI = os.path.join(BUILD, "client", "fusebox")
EXAMPLES = os.path.join(ROOT, "examples")

_LIB = tempfile.mkdtemp(prefix="fusebox-pytest-lib-")
subprocess.check_call([sys.executable, "setup.py", "-q", "build_py", "--build-lib", _LIB],
                      cwd=PYROOT, stdout=subprocess.DEVNULL)
sys.path.insert(0, _LIB)

import fusebox  # noqa: E402


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_LIB, ignore_errors=True)


@pytest.fixture
def fuseboxd(monkeypatch):
    """The path of the built fuseboxd, also as $FUSEBOXD."""
    if not os.access(FUSEBOXD, os.X_OK):
        pytest.fail(f"no fuseboxd at {FUSEBOXD}: build first")
    monkeypatch.setenv("FUSEBOXD", FUSEBOXD)
    return FUSEBOXD


@pytest.fixture
def fb(fuseboxd):
    """A client of a private fuseboxd that connect() started itself."""
    c = fusebox.connect()
    d = c._daemon
    yield c
    d.log.flush()
    d.log.seek(0)
    print("fuseboxd log:\n" + d.log.read().decode(errors="replace")[-20000:])  # shown on failure
    c.close()
    assert d.proc.returncode == 0, f"fuseboxd exited {d.proc.returncode}"


@pytest.fixture
def server(fuseboxd):
    """A fuseboxd started by the test (not by the package): its address and
    process; stopped with SIGTERM at the end."""
    d = fusebox.client._Daemon(fuseboxd)
    yield d
    if d.proc.poll() is None:
        err = d.stop()
        assert d.proc.returncode == 0, f"fuseboxd exited {d.proc.returncode}: {err[-2000:]}"


def example(name):
    with open(os.path.join(EXAMPLES, name)) as f:
        return f.read()


@pytest.fixture
def make_server(fuseboxd):
    """make_server(*args, listen=None): a fuseboxd started by the test with
    those flags (on a unix socket, or listen such as 127.0.0.1:0); each must
    exit 0 on SIGTERM at the end."""
    made = []

    def make(*args, listen=None):
        d = fusebox.client._Daemon(fuseboxd, args, listen=listen)
        made.append(d)
        return d

    yield make
    for d in made:
        if d.proc.poll() is None:
            err = d.stop()
            assert d.proc.returncode == 0, f"fuseboxd exited {d.proc.returncode}: {err[-2000:]}"
