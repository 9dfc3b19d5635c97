"""What calibrate.py and validate.py share: the fusebox package built from
this checkout (setup.py build_py into a temporary folder, as the package's
tests do) and where the built programs are."""
import atexit
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def import_fusebox():
    lib = tempfile.mkdtemp(prefix="fusebox-fleet-lib-")
    atexit.register(shutil.rmtree, lib, True)
    subprocess.check_call([sys.executable, "setup.py", "-q", "build_py", "--build-lib", lib],
                          cwd=os.path.join(ROOT, "python"), stdout=subprocess.DEVNULL)
    sys.path.insert(0, lib)
    import fusebox
    return fusebox


def find(given, env, rel):
    """given, else $env, else the first of ROOT/build-rel/rel, ROOT/build/rel
    that is executable; SystemExit naming where it looked otherwise."""
    tried = []
    for p in ([given] if given else []) + ([os.environ[env]] if os.environ.get(env) else []) + \
            [os.path.join(ROOT, b, rel) for b in ("build-rel", "build")]:
        if os.access(p, os.X_OK):
            return os.path.abspath(p)
        tried.append(p)
        if given:
            break
    raise SystemExit(f"{os.path.basename(sys.argv[0])}: no {rel} (looked at {', '.join(tried)}); "
                     "build it (cmake --build build-rel) or name it")
