"""sparse_pointer (bench/real/sparse_pointer.fbk), after the `taichi` wheel's
examples/features/sparse/taichi_sparse.py: pointer(n/64) > pointer(4) >
pointer(4) > dense(4) over an n x n grid (n = 512); each frame
block1.deactivate_all(), activate a moving pattern (our own three-bladed
fan, as cheap to test as the example's logo, turning 0.05 rad a frame) over all n^2 cells, paint an image adding up
is_active at every level, and count the active cells of each level with a
struct-for per level."""
import taichi as ti  # also a global: Taichi 0.7 compiles ti.func bodies against module globals
N = 512


def make(ti):
    n = N
    res = n + n // 4 + n // 16 + n // 64
    x = ti.field(ti.i32)
    block1 = ti.root.pointer(ti.ij, n // 64)
    block2 = block1.pointer(ti.ij, 4)
    block3 = block2.pointer(ti.ij, 4)
    block3.dense(ti.ij, 4).place(x)
    img = ti.field(ti.f32, shape=(res, res))
    frame = ti.field(ti.i32, shape=())
    c1 = ti.field(ti.i32, shape=())
    c2 = ti.field(ti.i32, shape=())
    c3 = ti.field(ti.i32, shape=())
    cx = ti.field(ti.i32, shape=())

    @ti.func
    def bar(x, y):
        on = 0
        if x > 0.06 and x < 0.44 and y > -0.05 and y < 0.05:
            on = 1
        return on

    @ti.func
    def fan(x, y):
        r2 = x * x + y * y
        on = bar(x, y) + bar(-0.5 * x + 0.8660254 * y, -0.8660254 * x - 0.5 * y) \
            + bar(-0.5 * x - 0.8660254 * y, 0.8660254 * x - 0.5 * y)
        if r2 < 0.0064:
            on = 1
        if r2 > 0.2025 and r2 < 0.2304:
            on = 1
        return on

    @ti.func
    def scatter(i):
        return i + i // 4 + i // 16 + i // 64 + 2

    @ti.kernel
    def clear_img():
        for i, j in img:
            img[i, j] = 0.05
        frame[None] = 0

    @ti.kernel
    def activate():
        turn = ti.cast(frame[None], ti.f32) * 0.05
        c = ti.cos(turn)
        s = ti.sin(turn)
        for i, j in ti.ndrange(n, n):
            dx = (ti.cast(i, ti.f32) + 0.5) / n - 0.5
            dy = (ti.cast(j, ti.f32) + 0.5) / n - 0.5
            if fan(c * dx + s * dy, c * dy - s * dx) > 0:
                x[i, j] = 1
        frame[None] += 1

    @ti.kernel
    def paint():
        for i, j in ti.ndrange(n, n):
            t = x[i, j]
            t += ti.is_active(block1, [i // 64, j // 64])
            t += ti.is_active(block2, [i // 16, j // 16])
            t += ti.is_active(block3, [i // 4, j // 4])
            img[scatter(i), scatter(j)] = 1.0 - t / 4.0

    @ti.kernel
    def census():
        c1[None] = 0
        c2[None] = 0
        c3[None] = 0
        cx[None] = 0
        for I, J in block1:
            c1[None] += 1
        for I, J in block2:
            c2[None] += 1
        for I, J in block3:
            c3[None] += 1
        for i, j in x:
            cx[None] += x[i, j]

    def step():
        block1.deactivate_all()
        activate()
        paint()
        census()

    return {"setup": clear_img, "step": step,
            "fields": {"img": img, "x": x, "c1": c1, "c2": c2, "c3": c3, "cx": cx}}
