"""Heat diffusion (examples/heat.fbk) from Python: the same run as
`fusebox run examples/heat.json`, in sync and in async mode, with the
temperature field as a NumPy array.

    python3 python/examples/heat.py [--server ADDR]
"""
import argparse
import os
import time

import numpy as np

import fusebox

HERE = os.path.dirname(os.path.abspath(__file__))
FBK = os.path.join(HERE, "..", "..", "examples", "heat.fbk")


def run(fb: fusebox.Client, mode: str, steps: int = 100) -> np.ndarray:
    with fb.session(file=FBK, mode=mode, seed=1) as s:
        s.kernels.init()
        T, U = s.fields.T, s.fields.U
        t0 = time.perf_counter()
        for _ in range(steps):
            s.kernels.step(T, U, k=0.2)
            s.kernels.step(U, T, k=0.2)
        out = T.to_numpy()  # syncs first
        c = s.counters()
        print(f"{mode:5}: {2 * steps} launches in {time.perf_counter() - t0:.3f} s, "
              f"{c.tasks_launched} tasks ({c.tasks_fused} fused), total heat {out.sum():.1f}")
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", help="host:port or unix:PATH (default: a private fuseboxd)")
    a = ap.parse_args()
    with fusebox.connect(a.server) as fb:
        sync, async_ = run(fb, "sync"), run(fb, "async")
        assert np.array_equal(sync, async_), "sync and async differ"
        assert abs(sync.sum() - 19300.0) < 19300.0 * 1e-4  # insulated: heat is conserved
        print("sync and async agree; hottest cell", sync.max())


if __name__ == "__main__":
    main()
