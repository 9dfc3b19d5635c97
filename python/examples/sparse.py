"""Sparse fields (examples/sparse.fbk) from Python: which cells are active,
with their values, as NumPy arrays; cells written, activated and
deactivated one by one.

    python3 python/examples/sparse.py [--server ADDR]
"""
import argparse
import os

import numpy as np

import fusebox

HERE = os.path.dirname(os.path.abspath(__file__))
FBK = os.path.join(HERE, "..", "..", "examples", "sparse.fbk")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", help="address of a running fuseboxd (default: a private one)")
    args = ap.parse_args()
    with fusebox.connect(args.server) as fb, fb.session(file=FBK, mode="async") as s:
        rho = s.fields.rho                 # pointer(16x16 blocks) of bitmasked(8x8 cells)
        s.kernels.paint()                  # a diagonal band of width 3
        idx, val = rho.active()
        print(f"after paint: {len(idx)} active cells of {rho.active_mask().size}, "
              f"sum {val.sum():.1f}")
        s.kernels.prune()                  # drops the blocks off the main diagonal
        idx, val = rho.active()
        blocks = {(int(i) // 8, int(j) // 8) for i, j in idx}
        print(f"after prune: {len(idx)} active cells in {len(blocks)} blocks, "
              f"all on the diagonal: {all(a == b for a, b in blocks)}")
        rho[100, 3] = 5.0                  # one cell: activates it (and its block)
        rho.deactivate(idx[:8])            # the first eight cells of the band
        s.kernels.measure()
        cells = int(s.fields.active_cells.to_numpy())
        idx, val = rho.active()
        assert cells == len(idx), (cells, len(idx))
        print(f"after edits: {len(idx)} active cells (the kernel's count agrees), "
              f"rho[100, 3] = {rho[100, 3]}")
        s.kernels.fill_lists()             # list i of `items` holds i % 5 values
        li, lv = s.fields.items.active()
        lengths = np.bincount(li[:, 0], minlength=128)
        print(f"lists: {len(li)} items, list 7 holds {lv[li[:, 0] == 7].tolist()}, "
              f"longest {lengths.max()}")


if __name__ == "__main__":
    main()
