"""Helpers around sessions: :func:`bench` runs JSON session files with the
``fusebox bench`` command line and returns its figures as a list of dicts
(ready for ``pandas.DataFrame``); :func:`plot` shows a 2-D field with
matplotlib."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union


def find_cli() -> str:
    """The ``fusebox`` command line: $FUSEBOX_CLI, beside the package, a
    build folder of the checkout the package lies in, or PATH."""
    env = os.environ.get("FUSEBOX_CLI")
    if env:
        if os.access(env, os.X_OK):
            return env
        raise FileNotFoundError(f"$FUSEBOX_CLI is {env!r}, which is not an executable file")
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    try:
        builds = sorted(d for d in os.listdir(root) if d.startswith("build"))
    except OSError:
        builds = []
    cands = [os.path.join(here, "bin", "fusebox")]
    cands += [os.path.join(root, d, "client", "fusebox") for d in builds]
    for c in cands:
        if os.access(c, os.X_OK):
            return c
    p = shutil.which("fusebox")
    if p:
        return p
    raise FileNotFoundError("fusebox.bench(): no fusebox command line (looked at $FUSEBOX_CLI, "
                            + ", ".join(cands) + " and PATH)")


def bench(files: Union[str, Sequence[str]], *, modes: Optional[Sequence[str]] = None,
          warmup: Optional[int] = None, repeat: Optional[int] = None,
          params: Optional[Mapping[str, Any]] = None, server: Any = None,
          local: bool = False, timeout: Optional[float] = None) -> List[Dict[str, Any]]:
    """Run JSON session files (docs/sessions.md) in several engine modes,
    as ``fusebox bench`` does, and return one dict per file and mode:
    ``{"case", "mode", "checks_passed", "wall_s", "cpu_s", "tasks_launched",
    ...}`` (``pandas.DataFrame(rows)`` makes a table of it).

    Args:
        files: a session file or several.
        modes: e.g. ["sync", "async", "async-no-fusion"] (default: each
            file's bench.modes, else sync and async).
        warmup, repeat: steps before timing, and timed steps.
        params: values for ${NAME} in every file.
        server: a :class:`fusebox.Client` or an address: run on that
            fuseboxd (times then include the transport). Default: the
            engine in the ``fusebox`` process (``local``) unless
            $FUSEBOX_SERVER is set.

    Raises :class:`fusebox.Error` when a session cannot run or a launch
    fails (exit status 2 of ``fusebox bench``, with its message). A check
    that fails, or a field that differs between modes, is reported in
    ``checks_passed`` of the rows.
    """
    from fusebox.errors import Error
    if isinstance(files, (str, os.PathLike)):
        files = [os.fspath(files)]
    with tempfile.TemporaryDirectory(prefix="fusebox-bench-") as d:
        out = os.path.join(d, "bench.json")
        cmd = [find_cli(), "bench", *files, "--json", out]
        if modes:
            cmd += ["--modes", ",".join(modes)]
        if warmup is not None:
            cmd += ["--warmup", str(int(warmup))]
        if repeat is not None:
            cmd += ["--repeat", str(int(repeat))]
        for k, v in (params or {}).items():
            cmd += ["--param", f"{k}={v}"]
        if server is not None:
            cmd += ["--server", getattr(server, "address", server)]
        elif local:
            cmd += ["--local"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if r.returncode not in (0, 1) or not os.path.exists(out):
            raise Error(f"fusebox bench failed (exit status {r.returncode}): "
                        f"{(r.stderr or r.stdout).strip()[-4000:]}")
        with open(out) as f:
            doc = json.load(f)
    rows = []
    for case in doc.get("cases", []):
        for mode, figs in case.get("modes", {}).items():
            rows.append({"case": case.get("name"), "mode": mode,
                         "checks_passed": case.get("checks_passed"), **figs})
    return rows


def plot(field: Any, ax: Any = None, title: Optional[str] = None, **imshow: Any) -> Any:
    """Show a 2-D field (a :class:`fusebox.Field` or an array) as an image
    with matplotlib; returns the AxesImage. Raises ImportError naming
    matplotlib when it is not installed, ValueError for a field that is not
    2-D."""
    import numpy as np
    name = getattr(field, "name", None)
    shape = tuple(getattr(field, "shape", np.shape(field)))
    if len(shape) != 2:
        raise ValueError(f"fusebox.plot: {'field ' + repr(name) if name else 'the array'} has "
                         f"shape {shape}; plot shows 2-D fields")
    try:
        import matplotlib.pyplot as plt  # type: ignore
    except ImportError as e:
        raise ImportError("fusebox.plot needs matplotlib (pip install matplotlib, or "
                          "apt install python3-matplotlib)") from e
    a = field.to_numpy() if hasattr(field, "to_numpy") else np.asarray(field)
    if ax is None:
        ax = plt.gca()
    # a[i, j] at row i, column j, i growing upwards
    im = ax.imshow(a, **{"origin": "lower", "interpolation": "nearest", **imshow})
    ax.set_title(title if title is not None else (name or ""))
    ax.figure.colorbar(im, ax=ax)
    return im
