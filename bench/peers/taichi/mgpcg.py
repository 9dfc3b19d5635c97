"""MGPCG in 2-D or 3-D (bench/large/mgpcg2d.fbk, mgpcg3d.fbk): a Poisson
solve by CG preconditioned with a multigrid V-cycle on a pointer -> dense(8^d)
grid whose centre N^d region is active. Every launch of the Fusebox session,
in the same order; all scalars in 0-D fields, computed by serial kernels."""
import taichi as ti  # also a global: Taichi 0.7 compiles ti.func bodies against module globals


def make(ti, dim, N, M, levels, iters):
    ind = ti.ij if dim == 2 else ti.ijk
    side = N + 2 * M
    blocks = [side // (8 * 2 ** l) for l in range(5)]

    def tree(l, fields):
        ti.root.pointer(ind, max(blocks[l], 1)).dense(ind, 8).place(*fields)

    x, p, Ap, b = (ti.field(ti.f32) for _ in range(4))
    tree(0, [x, p, Ap, b])
    r = [ti.field(ti.f32) for _ in range(5)]
    z = [ti.field(ti.f32) for _ in range(5)]
    for l in range(5):
        tree(l, [r[l], z[l]])
    (alpha, beta, pAp, rTr, zTr, old_zTr, rTr0, residual, bAx, true_residual,
     x_peak) = (ti.field(ti.f32, shape=()) for _ in range(11))
    diag = 2.0 * dim

    @ti.func
    def nsum(F: ti.template(), I):
        s = 0.0
        for d in ti.static(range(dim)):
            e = ti.Vector.unit(dim, d, ti.i32)
            s += F[I - e] + F[I + e]
        return s

    @ti.kernel
    def init():
        old_zTr[None] = 1.0
        h2 = 1.0 / (N * N)
        for I in ti.grouped(ti.ndrange(*([(M, M + N)] * dim))):
            f = h2
            for d in ti.static(range(dim)):
                f *= ti.sin(2.0 * 3.14159265 * (float(I[d] - M) / N))
            b[I] = f
            r[0][I] = b[I]
            z[0][I] = 0.0
            x[I] = 0.0
            p[I] = 0.0
            Ap[I] = 0.0

    @ti.kernel
    def reduce(u: ti.template(), w: ti.template(), out: ti.template()):
        out[None] = 0.0
        for I in ti.grouped(u):
            out[None] += u[I] * w[I]

    @ti.kernel
    def clear(F: ti.template()):
        for I in ti.grouped(F):
            F[I] = 0.0

    @ti.kernel
    def compute_Ap():
        for I in ti.grouped(Ap):
            Ap[I] = diag * p[I] - nsum(p, I)

    @ti.kernel
    def update_alpha():
        alpha[None] = old_zTr[None] / pAp[None]

    @ti.kernel
    def update_x():
        for I in ti.grouped(p):
            x[I] += alpha[None] * p[I]

    @ti.kernel
    def update_r():
        for I in ti.grouped(p):
            r[0][I] -= alpha[None] * Ap[I]

    @ti.kernel
    def update_beta():
        beta[None] = zTr[None] / old_zTr[None]
        old_zTr[None] = zTr[None]

    @ti.kernel
    def update_p():
        for I in ti.grouped(p):
            p[I] = z[0][I] + beta[None] * p[I]

    @ti.kernel
    def smooth(rf: ti.template(), zf: ti.template(), phase: ti.i32):
        for I in ti.grouped(rf):
            parity = 0
            for d in ti.static(range(dim)):
                parity += I[d]
            if (parity & 1) == phase:
                zf[I] = (rf[I] + nsum(zf, I)) / diag

    @ti.kernel
    def restrict(rf: ti.template(), zf: ti.template(), rc: ti.template()):
        for I in ti.grouped(rf):
            res = rf[I] - (diag * zf[I] - nsum(zf, I))
            rc[I // 2] += res * 0.5

    @ti.kernel
    def prolongate(zf: ti.template(), zc: ti.template()):
        for I in ti.grouped(zf):
            zf[I] += zc[I // 2]

    @ti.kernel
    def measure():
        bAx[None] = 0.0
        x_peak[None] = 0.0
        for I in ti.grouped(x):
            d = b[I] - (diag * x[I] - nsum(x, I))
            bAx[None] += d * d
            ti.atomic_max(x_peak[None], abs(x[I]))
        residual[None] = ti.sqrt(rTr[None] / rTr0[None])
        true_residual[None] = ti.sqrt(bAx[None] / rTr0[None])

    bottom = levels - 1

    def vcycle():
        clear(z[0])
        for l in range(bottom):
            for _ in range(2 << l):
                smooth(r[l], z[l], 0)
                smooth(r[l], z[l], 1)
            clear(z[l + 1])
            clear(r[l + 1])
            restrict(r[l], z[l], r[l + 1])
        for _ in range(50):
            smooth(r[bottom], z[bottom], 0)
            smooth(r[bottom], z[bottom], 1)
        for l in reversed(range(bottom)):
            prolongate(z[l], z[l + 1])
            for _ in range(2 << l):
                smooth(r[l], z[l], 1)
                smooth(r[l], z[l], 0)

    def step():
        init()
        reduce(r[0], r[0], rTr0)
        for _ in range(iters):
            vcycle()
            reduce(z[0], r[0], zTr)
            update_beta()
            update_p()
            compute_Ap()
            reduce(p, Ap, pAp)
            update_alpha()
            update_x()
            update_r()
            reduce(r[0], r[0], rTr)
        measure()

    return {"setup": lambda: None, "step": step, "rtol": 1e-3, "fields": {"x": x},
            "checks": {"residual": residual, "true_residual": true_residual, "x_peak": x_peak}}
