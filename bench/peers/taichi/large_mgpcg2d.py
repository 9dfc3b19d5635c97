"""mgpcg2d (bench/large/mgpcg2d.json): N = 512, M = 256, 4 levels, 20 iterations."""
import taichi as ti  # also a global: Taichi 0.7 compiles ti.func bodies against module globals
import mgpcg


def make(ti):
    return mgpcg.make(ti, dim=2, N=512, M=256, levels=4, iters=20)
