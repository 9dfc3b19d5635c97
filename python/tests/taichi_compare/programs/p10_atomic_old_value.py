"""ti.atomic_add returns the old value: slot allocation in a parallel loop."""
import numpy as np
import taichi as ti

ti.init(arch=ti.cpu)

n = 64
counter = ti.field(ti.i32, shape=())
slot_of = ti.field(ti.i32, shape=n)
owner = ti.field(ti.i32, shape=n)


@ti.kernel
def allocate():
    for i in range(n):
        if i % 3 != 0:
            s = ti.atomic_add(counter[None], 1)
            slot_of[i] = s
            owner[s] = i


def run():
    slot_of.fill(-1)
    owner.fill(-1)
    allocate()
    used = int(counter[None])
    s = slot_of.to_numpy()
    o = owner.to_numpy()
    # the slots form a permutation of 0..used-1, whatever order the threads ran in
    return {"count": counter.to_numpy(), "slots_sorted": np.sort(s[s >= 0]),
            "owners_sorted": np.sort(o[:used]), "unused": o[used:],
            "consistent": s[o[:used]] == np.arange(used, dtype=np.int32)}
