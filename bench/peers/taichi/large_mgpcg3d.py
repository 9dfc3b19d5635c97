"""mgpcg3d (bench/large/mgpcg3d.json): N = 64, M = 64, 4 levels, 8 iterations."""
import taichi as ti  # also a global: Taichi 0.7 compiles ti.func bodies against module globals
import mgpcg


def make(ti):
    return mgpcg.make(ti, dim=3, N=64, M=64, levels=4, iters=8)
