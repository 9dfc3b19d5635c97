"""maccormack_channels (bench/large/maccormack_channels.fbk): the paper's
multi-kernel form, a scalar kernel launched per dye channel (maccormack.py)."""
import taichi as ti  # also a global: Taichi 0.7 compiles ti.func bodies against module globals
import maccormack


def make(ti):
    return maccormack.make(ti, channels=True)
