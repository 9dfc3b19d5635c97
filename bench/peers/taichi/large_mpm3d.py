"""mpm3d (bench/large/mpm3d.fbk): 3-D MLS-MPM, a falling cube of fluid on
two sparse grids (pointer -> pointer(4) -> dense(8)) swapped each substep,
particles visited through per-block particle-id lists (pointer -> dynamic);
a step is 20 substeps (10 pairs A -> B, B -> A)."""
import taichi as ti  # also a global: Taichi 0.7 compiles ti.func bodies against module globals
G = 64
GTOP = G // 32
NB = G // 8
NSIDE = 32
NP = NSIDE ** 3
DT = 2e-4


def make(ti):
    inv_dx = float(G)
    p_vol = (0.5 / G) ** 3

    def grid():
        m = ti.field(ti.f32)
        v = ti.Vector.field(3, dtype=ti.f32)
        top = ti.root.pointer(ti.ijk, GTOP)
        top.pointer(ti.ijk, 4).dense(ti.ijk, 8).place(m, v)
        return top, m, v

    topA, mA, vA = grid()
    topB, mB, vB = grid()
    pblocks = ti.root.pointer(ti.ijk, NB)
    pid = ti.field(ti.i32)
    pblocks.dynamic(ti.l, 32768, chunk_size=256).place(pid)
    x = ti.Vector.field(3, dtype=ti.f32)
    v = ti.Vector.field(3, dtype=ti.f32)
    C = ti.Matrix.field(3, 3, dtype=ti.f32)
    J = ti.field(ti.f32)
    ti.root.dense(ti.i, NP).place(x, v, C, J)

    @ti.func
    def base_cell(xp):
        return ti.floor(xp * inv_dx - 0.5)

    @ti.kernel
    def init():
        for p in x:
            a = p % NSIDE
            b = (p // NSIDE) % NSIDE
            c = p // (NSIDE * NSIDE)
            h = 0.5 / G
            x[p] = ti.Vector([0.375, 0.1, 0.375]) + (ti.Vector([float(a), float(b), float(c)]) + 0.5) * h
            v[p] = ti.Vector([0.0, -3.0, 0.0])
            J[p] = 1.0
            C[p] = ti.Matrix.zero(ti.f32, 3, 3)

    @ti.kernel
    def clear_grid(T: ti.template()):
        for bx, by, bz in T:
            ti.deactivate(T, [bx, by, bz])

    @ti.kernel
    def clear_pid():
        for bx, by, bz in pblocks:
            ti.deactivate(pblocks, [bx, by, bz])

    @ti.kernel
    def build_pid():
        for p in x:
            b = base_cell(x[p]).cast(int) // 8
            ti.append(pid.parent(), b, p)

    @ti.kernel
    def g2p(gv: ti.template()):
        for bx, by, bz, s in pid:
            p = pid[bx, by, bz, s]
            base = base_cell(x[p])
            fx = x[p] * inv_dx - base
            w = [0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1.0) ** 2, 0.5 * (fx - 0.5) ** 2]
            bi = base.cast(int)
            new_v = ti.Vector.zero(ti.f32, 3)
            new_C = ti.Matrix.zero(ti.f32, 3, 3)
            for a, b, c in ti.static(ti.ndrange(3, 3, 3)):
                off = ti.Vector([a, b, c])
                dpos = (off.cast(float) - fx) / inv_dx
                weight = w[a][0] * w[b][1] * w[c][2]
                g_v = gv[bi + off]
                new_v += weight * g_v
                new_C += 4.0 * inv_dx * inv_dx * weight * g_v.outer_product(dpos)
            v[p] = new_v
            x[p] += DT * new_v
            J[p] *= 1.0 + DT * new_C.trace()
            C[p] = new_C

    @ti.kernel
    def p2g(gm: ti.template(), gv: ti.template()):
        for bx, by, bz, s in pid:
            p = pid[bx, by, bz, s]
            base = base_cell(x[p])
            fx = x[p] * inv_dx - base
            w = [0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1.0) ** 2, 0.5 * (fx - 0.5) ** 2]
            bi = base.cast(int)
            stress = -DT * 4.0 * 400.0 * p_vol * (J[p] - 1.0) * inv_dx * inv_dx
            affine = stress * ti.Matrix.identity(ti.f32, 3) + p_vol * C[p]
            for a, b, c in ti.static(ti.ndrange(3, 3, 3)):
                off = ti.Vector([a, b, c])
                dpos = (off.cast(float) - fx) / inv_dx
                weight = w[a][0] * w[b][1] * w[c][2]
                gv[bi + off] += weight * (p_vol * v[p] + affine @ dpos)
                gm[bi + off] += weight * p_vol

    @ti.kernel
    def grid_op(gm: ti.template(), gv: ti.template()):
        for i, j, k in gm:
            vel = gv[i, j, k]
            if gm[i, j, k] > 0.0:
                vel /= gm[i, j, k]
            vel[1] -= DT * 9.8
            I = ti.Vector([i, j, k])
            for d in ti.static(range(3)):
                if (I[d] < 3 and vel[d] < 0.0) or (I[d] > G - 3 and vel[d] > 0.0):
                    vel[d] = 0.0
            gv[i, j, k] = vel

    def setup():
        init()
        build_pid()
        p2g(mA, vA)
        grid_op(mA, vA)

    def step():
        for _ in range(10):
            clear_grid(topB)
            clear_pid()
            build_pid()
            g2p(vA)
            p2g(mB, vB)
            grid_op(mB, vB)
            clear_grid(topA)
            clear_pid()
            build_pid()
            g2p(vB)
            p2g(mA, vA)
            grid_op(mA, vA)

    return {"setup": setup, "step": step, "rtol": 1e-3, "fields": {"x": x, "J": J, "mA": mA}}
