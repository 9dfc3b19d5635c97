"""The package builds as a wheel from the checkout (offline: no build
isolation, no dependencies fetched), the wheel carries the stubs made from
proto/fusebox.proto, and it installs and imports."""
import os
import subprocess
import sys
import zipfile

from conftest import PYROOT


def test_wheel_builds_and_installs(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation",
                        "--no-deps", "--no-index", "-q", "-w", str(tmp_path), PYROOT],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    wheels = [p for p in os.listdir(tmp_path) if p.endswith(".whl")]
    assert wheels == ["fusebox-0.1.0-py3-none-any.whl"]
    whl = str(tmp_path / wheels[0])
    names = zipfile.ZipFile(whl).namelist()
    assert "fusebox/_gen/fusebox_pb2.py" in names and "fusebox/session.py" in names
    assert "fusebox/taichi/__init__.py" in names and "fusebox/taichi/_translate.py" in names
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q",
                        "--target", str(target), whl], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-c",
                        "import fusebox, fusebox._proto as p, fusebox.taichi; "
                        "print(fusebox.__file__); "
                        "print(p.pb.DESCRIPTOR.services_by_name['Fusebox'].full_name)"],
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(target)}, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(target / "fusebox" / "__init__.py"), "fusebox.v1.Fusebox"]
