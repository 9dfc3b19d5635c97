"""Conway's Game of Life (examples/life.fbk) from Python: a glider and a
blinker on a 64 x 64 torus, the board read as a NumPy array and drawn in
text, the population counted by a kernel that returns a value.

    python3 python/examples/life.py [--server ADDR] [--generations N]
"""
import argparse
import os

import numpy as np

import fusebox

HERE = os.path.dirname(os.path.abspath(__file__))
FBK = os.path.join(HERE, "..", "..", "examples", "life.fbk")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", help="host:port or unix:PATH (default: a private fuseboxd)")
    ap.add_argument("--generations", type=int, default=256)
    a = ap.parse_args()
    with fusebox.connect(a.server) as fb, fb.session(file=FBK, mode="async") as s:
        s.kernels.seed()
        for _ in range(a.generations // 2):
            s.kernels.step("a", "b")
            s.kernels.step("b", "a")
        board = s.fields.a.to_numpy()
        print(f"after {a.generations // 2 * 2} generations: population {s.kernels.count()}")
        rows = np.nonzero(board.any(axis=1))[0]
        for r in rows:
            print(f"{r:3} " + "".join("#" if x else "." for x in board[r]))
        # a glider of one's own: write the board from NumPy and go on
        g = np.zeros((64, 64), dtype=np.int32)
        g[10:13, 10:13] = [[0, 1, 0], [0, 0, 1], [1, 1, 1]]
        s.fields.a[:] = g
        for _ in range(2):
            s.kernels.step("a", "b")
            s.kernels.step("b", "a")
        print("a fresh glider after 4 generations: population", s.kernels.count())


if __name__ == "__main__":
    main()
