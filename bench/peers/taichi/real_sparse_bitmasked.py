"""sparse_bitmasked (bench/real/sparse_bitmasked.fbk), after the `taichi`
wheel's examples/features/sparse/taichi_bitmasked.py grown to the multi-level
tree of taichi_sparse.py: pointer(n/32) > bitmasked(4) > bitmasked(8) over an
n x n grid (n = 512). Each frame: cells holding density activate their four
neighbours, a semi-Lagrangian step with a bilinear stencil pulls the density
along a solid rotation, cells below eps are deactivated, and the active cells
of every level are counted with a struct-for per level."""
import taichi as ti  # also a global: Taichi 0.7 compiles ti.func bodies against module globals
N = 512


def make(ti):
    n = N
    eps = 0.001
    spin = 0.004
    u = ti.field(ti.f32)
    v = ti.field(ti.f32)
    blocks = ti.root.pointer(ti.ij, n // 32)
    tiles = blocks.bitmasked(ti.ij, 4)
    tiles.bitmasked(ti.ij, 8).place(u, v)
    c1 = ti.field(ti.i32, shape=())
    c2 = ti.field(ti.i32, shape=())
    c3 = ti.field(ti.i32, shape=())
    c4 = ti.field(ti.i32, shape=())
    mass = ti.field(ti.f32, shape=())

    @ti.func
    def blob(x, y, cx, cy, r):
        d = ti.sqrt((x - cx) * (x - cx) + (y - cy) * (y - cy))
        return ti.min(ti.max((r - d) / 0.02, 0.0), 1.0)

    @ti.kernel
    def seed():
        for i, j in ti.ndrange(n, n):
            x = (ti.cast(i, ti.f32) + 0.5) / n
            y = (ti.cast(j, ti.f32) + 0.5) / n
            d = blob(x, y, 0.72, 0.5, 0.12) + blob(x, y, 0.3, 0.35, 0.08) \
                + blob(x, y, 0.45, 0.78, 0.1)
            if d > 0.0:
                u[i, j] = d

    @ti.kernel
    def dilate():
        # a write activates the whole path (ti.activate on a cell under an
        # inactive tile does not); v is scratch, rewritten by advect
        for i, j in u:
            if u[i, j] > eps:
                if i > 0:
                    v[i - 1, j] = 0.0
                if i < n - 1:
                    v[i + 1, j] = 0.0
                if j > 0:
                    v[i, j - 1] = 0.0
                if j < n - 1:
                    v[i, j + 1] = 0.0

    @ti.func
    def at(i, j):
        r = 0.0
        if i >= 0 and i < n and j >= 0 and j < n:
            r = u[i, j]
        return r

    @ti.func
    def bilerp(px, py):
        fx = ti.floor(px)
        fy = ti.floor(py)
        i = ti.cast(fx, ti.i32)
        j = ti.cast(fy, ti.i32)
        s = px - fx
        t = py - fy
        return (1.0 - s) * ((1.0 - t) * at(i, j) + t * at(i, j + 1)) \
            + s * ((1.0 - t) * at(i + 1, j) + t * at(i + 1, j + 1))

    @ti.kernel
    def advect():
        c = ti.cos(spin)
        s = ti.sin(spin)
        for i, j in u:
            x = ti.cast(i, ti.f32) + 0.5 - 0.5 * n
            y = ti.cast(j, ti.f32) + 0.5 - 0.5 * n
            bx = c * x + s * y
            by = c * y - s * x
            v[i, j] = bilerp(bx + 0.5 * n - 0.5, by + 0.5 * n - 0.5)

    @ti.kernel
    def commit():
        for i, j in u:
            u[i, j] = v[i, j]

    @ti.kernel
    def prune():
        for i, j in u:
            if u[i, j] < eps:
                u[i, j] = 0.0  # a deactivated bitmasked cell keeps its bytes in Taichi
                ti.deactivate(u.snode.parent(), [i, j])

    @ti.kernel
    def census():
        c1[None] = 0
        c2[None] = 0
        c3[None] = 0
        c4[None] = 0
        mass[None] = 0.0
        for I, J in blocks:
            c1[None] += 1
        for I, J in tiles:
            c2[None] += 1
        for i, j in u:
            c3[None] += 1
            c4[None] += ti.is_active(tiles, [i // 8, j // 8])
            mass[None] += u[i, j]

    def step():
        dilate()
        advect()
        commit()
        prune()
        census()

    return {"setup": seed, "step": step, "rtol": 1e-4,
            "fields": {"u": u, "c1": c1, "c2": c2, "c3": c3, "c4": c4, "mass": mass}}
