"""maccormack (bench/large/maccormack.fbk): the three dye channels in one
vector field, one launch a frame (maccormack.py)."""
import taichi as ti  # also a global: Taichi 0.7 compiles ti.func bodies against module globals
import maccormack


def make(ti):
    return maccormack.make(ti, channels=False)
