"""autodiff (bench/large/autodiff.fbk): Taichi's mpm_lagrangian_forces, the
energy's adjoint generated under ti.ad.Tape as Fusebox generates it for its
program's tape; a step is 50 substeps."""
import taichi as ti  # also a global: Taichi 0.7 compiles ti.func bodies against module globals
NPX, NPY = 100, 8
NP = NPX * NPY
NE = 2 * (NPX - 1) * (NPY - 1)
G = 64
DT = 1e-4


def make(ti):
    inv_dx = float(G)
    x = ti.Vector.field(2, dtype=ti.f32, needs_grad=True)
    v = ti.Vector.field(2, dtype=ti.f32)
    C = ti.Matrix.field(2, 2, dtype=ti.f32)
    ti.root.dense(ti.i, NP).place(x, x.grad, v, C)
    grid_v = ti.Vector.field(2, dtype=ti.f32)
    grid_m = ti.field(ti.f32)
    ti.root.dense(ti.ij, (G, G)).place(grid_v, grid_m)
    restT = ti.Matrix.field(2, 2, dtype=ti.f32)
    vertices = ti.Vector.field(3, dtype=ti.i32)
    ti.root.dense(ti.i, NE).place(restT, vertices)
    total_energy = ti.field(ti.f32, shape=(), needs_grad=True)
    Tape = ti.ad.Tape if hasattr(ti, "ad") and hasattr(ti.ad, "Tape") else ti.Tape

    @ti.func
    def mesh(i, j):
        return i * NPY + j

    @ti.func
    def compute_T(e):
        ab = x[vertices[e][1]] - x[vertices[e][0]]
        ac = x[vertices[e][2]] - x[vertices[e][0]]
        return ti.Matrix([[ab[0], ac[0]], [ab[1], ac[1]]])

    @ti.kernel
    def init():
        for i in range(NPX):
            for j in range(NPY):
                t = mesh(i, j)
                x[t] = ti.Vector([0.1 + i * 0.5 / inv_dx, 0.7 + j * 0.5 / inv_dx])
                v[t] = ti.Vector([0.0, -1.0])
        for i in range(NPX - 1):
            for j in range(NPY - 1):
                e = (i * (NPY - 1) + j) * 2
                vertices[e] = ti.Vector([mesh(i, j), mesh(i + 1, j), mesh(i, j + 1)])
                vertices[e + 1] = ti.Vector([mesh(i, j + 1), mesh(i + 1, j + 1), mesh(i + 1, j)])

    @ti.kernel
    def compute_rest_T():
        for e in restT:
            restT[e] = compute_T(e)

    @ti.kernel
    def stretch():
        yc = 0.7 + (NPY - 1) * 0.25 / inv_dx
        for p in x:
            x[p][1] = yc + (x[p][1] - yc) * 1.1

    @ti.kernel
    def clear_grid_m():
        for i, j in grid_m:
            grid_m[i, j] = 0.0

    @ti.kernel
    def clear_grid_v():
        for i, j in grid_v:
            grid_v[i, j] = ti.Vector([0.0, 0.0])

    @ti.kernel
    def reset_energy():  # as the Fusebox program does (Taichi 1.7's Tape also zeroes it)
        total_energy[None] = 0.0

    @ti.kernel
    def compute_total_energy():
        for e in restT:
            F = compute_T(e) @ restT[e].inverse()
            I1 = (F @ F.transpose()).trace()
            J = F.determinant()
            element_energy = 0.5 * (I1 - 2.0) - ti.log(J) + 0.5 * ti.log(J) ** 2
            total_energy[None] += element_energy * 1e-3

    @ti.kernel
    def p2g():
        for p in x:
            base = (x[p] * inv_dx - 0.5).cast(int)
            fx = x[p] * inv_dx - base.cast(float)
            w = [0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1.0) ** 2, 0.5 * (fx - 0.5) ** 2]
            affine = C[p]
            for i, j in ti.static(ti.ndrange(3, 3)):
                off = ti.Vector([i, j])
                dpos = (off.cast(float) - fx) / inv_dx
                weight = w[i][0] * w[j][1]
                grid_v[base + off] += weight * (v[p] - x.grad[p] + affine @ dpos)
                grid_m[base + off] += weight

    @ti.kernel
    def grid_op():
        for i, j in grid_m:
            if grid_m[i, j] > 0.0:
                g = grid_v[i, j] / grid_m[i, j]
                g[1] -= DT * 9.8
                d = ti.Vector([float(i), float(j)]) / inv_dx - 0.5
                if d[0] * d[0] + d[1] * d[1] < 0.005:
                    g = ti.Vector([0.0, 0.0])
                if i < 3 and g[0] < 0.0:
                    g[0] = 0.0
                if i > G - 3 and g[0] > 0.0:
                    g[0] = 0.0
                if j < 3 and g[1] < 0.0:
                    g[1] = 0.0
                if j > G - 3 and g[1] > 0.0:
                    g[1] = 0.0
                grid_v[i, j] = g

    @ti.kernel
    def g2p():
        for p in x:
            base = (x[p] * inv_dx - 0.5).cast(int)
            fx = x[p] * inv_dx - base.cast(float)
            w = [0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1.0) ** 2, 0.5 * (fx - 0.5) ** 2]
            new_v = ti.Vector.zero(ti.f32, 2)
            new_C = ti.Matrix.zero(ti.f32, 2, 2)
            for i, j in ti.static(ti.ndrange(3, 3)):
                dpos = ti.Vector([i, j]).cast(float) - fx
                g_v = grid_v[base + ti.Vector([i, j])]
                weight = w[i][0] * w[j][1]
                new_v += weight * g_v
                new_C += 4.0 * weight * g_v.outer_product(dpos) * inv_dx
            v[p] = new_v
            x[p] += DT * new_v
            C[p] = new_C

    def setup():
        init()
        compute_rest_T()
        stretch()

    def step():
        for _ in range(50):
            clear_grid_m()
            clear_grid_v()
            reset_energy()
            with Tape(loss=total_energy):  # clears the gradients, seeds the energy's
                compute_total_energy()
            p2g()
            grid_op()
            g2p()

    return {"setup": setup, "step": step, "rtol": 1e-3,
            "fields": {"x": x, "total_energy": total_energy}}
