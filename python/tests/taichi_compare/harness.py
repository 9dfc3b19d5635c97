"""The comparison with Taichi 1.7: finding (or making) a Python with
taichi 1.7 installed, running a program under both engines (runner.py, one
subprocess each) and comparing what they return, field by field.

Taichi is a test dependency only, never a runtime one: it lives in a
virtual environment, the interpreter $FB_TAICHI_PYTHON names, or
$FB_PEERS_DIR/taichi17 (default ~/.cache/fusebox-peers/taichi17, the one
scripts/bench_peers.sh makes; used, never changed), or the harness's own,
~/.cache/fusebox-taichi-tests/taichi17, which the first run makes with
``pip install 'taichi==1.7.*'`` from PyPI; only where that fails are the
comparisons skipped, with pip's message.
"""
import glob
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
RUNNER = os.path.join(HERE, "runner.py")
PROGRAMS = os.path.join(HERE, "programs")
TAICHI_SPEC = "taichi==1.7.*"
TIMEOUT = 600  # seconds per engine and program, on a loaded machine under ASan
PYTHONS = ("3.11", "3.10", "3.12", "3.9", "3.8")  # those with taichi 1.7 wheels


def _has_taichi(py):
    try:
        r = subprocess.run([py, "-c", "import sys, taichi; sys.exit(0 if tuple(taichi.__version__)"
                                      "[:2] == (1, 7) else 3)"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def _host_pythons():
    home = os.path.expanduser("~")
    for v in PYTHONS:
        for p in sorted(glob.glob(os.path.join(home, ".pyenv", "versions", v + ".*", "bin",
                                               "python"))) + ["/usr/bin/python" + v]:
            if os.access(p, os.X_OK):
                yield p


def _cache_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fusebox-taichi-tests")


def find_taichi():
    """(python, None) with taichi 1.7 importable, or (None, why not).

    Looks at $FB_TAICHI_PYTHON, then the benchmarks' environment
    $FB_PEERS_DIR/taichi17 (default ~/.cache/fusebox-peers/taichi17), used
    as it is and never changed; then this harness's own environment,
    ~/.cache/fusebox-taichi-tests/taichi17, made here when missing."""
    env = os.environ.get("FB_TAICHI_PYTHON")
    if env:
        if _has_taichi(env):
            return env, None
        return None, f"$FB_TAICHI_PYTHON={env} cannot import taichi 1.7"
    peers = os.environ.get("FB_PEERS_DIR") or os.path.join(os.path.expanduser("~"), ".cache",
                                                           "fusebox-peers")
    py = os.path.join(peers, "taichi17", "bin", "python")
    if os.access(py, os.X_OK) and _has_taichi(py):
        return py, None
    venv = os.path.join(_cache_dir(), "taichi17")
    py = os.path.join(venv, "bin", "python")
    marker = os.path.join(venv, ".installed")
    if os.path.exists(marker) and _has_taichi(py):
        return py, None
    errors = []
    for host in _host_pythons():
        try:
            os.makedirs(_cache_dir(), exist_ok=True)
            subprocess.run([host, "-m", "venv", "--clear", venv], check=True,
                           capture_output=True, timeout=300)
            r = subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                                TAICHI_SPEC], capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.SubprocessError) as e:
            errors.append(f"{host}: {e}")
            continue
        if r.returncode == 0 and _has_taichi(py):
            with open(marker, "w") as f:
                f.write(TAICHI_SPEC + "\n")
            return py, None
        errors.append(f"{host}: pip install {TAICHI_SPEC} failed: "
                      f"{(r.stderr or 'taichi does not import after it').strip()[-800:]}")
        if r.returncode == 0:
            break  # it installed but does not work: another Python will not do better
    if not errors:
        errors.append("no Python " + "/".join(PYTHONS) + " (taichi 1.7 has wheels for those)")
    return None, "Taichi 1.7 cannot be installed here: " + "; ".join(errors)


def programs():
    return sorted(os.path.splitext(f)[0] for f in os.listdir(PROGRAMS)
                  if f.endswith(".py") and not f.startswith("_"))


def program_path(name):
    return os.path.join(PROGRAMS, name + ".py")


def settings(name):
    """The program's comparison settings: module-level RTOL, ATOL (floats;
    integers and bools are compared exactly) and NEEDS_AD, read from the
    source without running it."""
    import ast
    with open(program_path(name)) as f:
        tree = ast.parse(f.read())
    out = {"RTOL": 1e-5, "ATOL": 1e-6, "NEEDS_AD": False}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Name) and node.targets[0].id in out:
            out[node.targets[0].id] = ast.literal_eval(node.value)
    return out


class EngineFailed(AssertionError):
    pass


def run_engine(kind, engine, python, path, workdir, env, timeout, *extra):
    """Runs runner.py; returns the dict of arrays it saved."""
    out = os.path.join(workdir, f"{engine}.npz")
    cmd = [python, RUNNER, kind, engine, path, out, *[str(e) for e in extra]]
    try:
        r = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired as e:
        tail = (e.stderr or b"")[-3000:]
        raise EngineFailed(f"{os.path.basename(path)} under {engine}: still running after "
                           f"{timeout} s\n{tail}") from None
    if r.returncode != 0 or not os.path.exists(out):
        raise EngineFailed(f"{os.path.basename(path)} under {engine} failed (exit "
                           f"{r.returncode}):\n{(r.stdout + r.stderr)[-6000:]}")
    with np.load(out) as z:
        return {k: z[k] for k in z.files}


def _same_layout(want, got, problems):
    """The keys whose names, shapes and dtypes agree; problems for the rest."""
    if set(want) != set(got):
        problems.append(f"Taichi returned {sorted(want)}, fusebox {sorted(got)}")
    keys = []
    for k in sorted(set(want) & set(got)):
        a, b = want[k], got[k]
        if a.shape != b.shape:
            problems.append(f"{k}: shape {a.shape} under Taichi, {b.shape} under fusebox")
        elif a.dtype != b.dtype:
            problems.append(f"{k}: dtype {a.dtype} under Taichi, {b.dtype} under fusebox")
        else:
            keys.append(k)
    return keys


def _fail(name, problems):
    if problems:
        raise AssertionError(f"{name}: fusebox.taichi differs from Taichi 1.7:\n  "
                             + "\n  ".join(problems))


def compare_shapes(name, want, got):
    """For programs whose values depend on a random stream: the same names,
    shapes and dtypes, and every float finite under both engines."""
    problems = []
    for k in _same_layout(want, got, problems):
        for who, a in (("Taichi", want[k]), ("fusebox", got[k])):
            if np.issubdtype(a.dtype, np.floating) and not np.isfinite(a).all():
                problems.append(f"{k}: not finite under {who}")
    _fail(name, problems)


def compare(name, want, got, rtol, atol, share=0.0):
    """Field by field: the same names, shapes and dtypes; floats within
    rtol/atol (NaN where the other has NaN) except at most `share` of the
    values of each, integers and bools exactly."""
    problems = []
    for k in _same_layout(want, got, problems):
        a, b = want[k], got[k]
        if np.issubdtype(a.dtype, np.floating):
            ok = np.isclose(b, a, rtol=rtol, atol=atol, equal_nan=True)
        else:
            ok = a == b
        if not np.all(ok) and (np.count_nonzero(~np.asarray(ok)) > share * a.size or
                               not np.issubdtype(a.dtype, np.floating)):
            bad = np.argwhere(~np.asarray(ok))
            first = tuple(int(i) for i in bad[0]) if bad.size else ()
            problems.append(f"{k}: {bad.shape[0] if bad.size else 1} of {a.size} values differ; "
                            f"first at {first}: Taichi {a[first]!r}, fusebox {b[first]!r}")
    _fail(name, problems)


def workdir(prefix):
    return tempfile.mkdtemp(prefix=prefix)


# -- pytest fixtures (imported by test_taichi_compare.py, test_taichi_examples.py)

@pytest.fixture(scope="module")
def taichi_python():
    py, why = find_taichi()
    if py is None:
        pytest.skip(why)
    return py


@pytest.fixture(scope="module")
def fb_env(request):
    """The environment of a fusebox.taichi run: the package built from this
    checkout, and one fuseboxd for the module on a unix socket."""
    import fusebox
    from conftest import FUSEBOXD
    if not os.access(FUSEBOXD, os.X_OK):
        pytest.fail(f"no fuseboxd at {FUSEBOXD}: build first")
    d = fusebox.client._Daemon(FUSEBOXD)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(fusebox.__file__)))
    env["FUSEBOX_SERVER"] = d.address
    env["FUSEBOXD"] = FUSEBOXD
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.pop("FUSEBOX_GUI_DIR", None)
    yield env
    err = d.stop()
    assert d.proc.returncode == 0, f"fuseboxd exited {d.proc.returncode}: {err[-3000:]}"


def taichi_env():
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["TI_GUI_SHOW"] = "0"
    return env


def run_both(kind, path, taichi_python, fb_env, *extra):
    """Runs under both engines at once; returns (taichi's, fusebox's) arrays."""
    wd_t = workdir("ti-taichi-")
    wd_f = workdir("ti-fusebox-")
    try:
        with ThreadPoolExecutor(2) as ex:
            ft = ex.submit(run_engine, kind, "taichi", taichi_python, path, wd_t,
                           taichi_env(), TIMEOUT, *extra)
            ff = ex.submit(run_engine, kind, "fusebox", sys.executable, path, wd_f, fb_env,
                           TIMEOUT, *extra)
            want = ft.result()  # a program that fails under Taichi is this test's own bug
            got = ff.result()
    finally:
        shutil.rmtree(wd_t, ignore_errors=True)
        shutil.rmtree(wd_f, ignore_errors=True)
    return want, got


