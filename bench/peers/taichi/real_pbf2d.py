"""real/pbf2d (bench/real/pbf2d.json): Taichi's examples/simulation/pbf2d.py
at its own size (1200 particles, 80 x 40 box, 5 solver iterations), a step
is one frame: move_board, prologue, 5 substeps, epilogue. Written as the
example writes it (dense cell lists with an atomic counter); the initial
velocities come from the same integer hash as the .fbk instead of
ti.random(). Neighbour order depends on thread timing, so the comparison
is within 1e-3."""
import math
import taichi as ti  # also a global: Taichi 0.7 compiles ti.func bodies against module globals
from real_mpm88 import hash01


def make(ti):
    boundary = (80.0, 40.0)
    cell_size = 2.51
    cell_recpr = 1.0 / cell_size
    grid_size = (32, 16)
    dim = 2
    num_particles_x = 60
    num_particles = num_particles_x * 20
    max_num_particles_per_cell = 100
    max_num_neighbors = 100
    time_delta = 1.0 / 20.0
    epsilon = 1e-5
    particle_radius_in_world = 0.3
    h_ = 1.1
    mass = 1.0
    rho0 = 1.0
    lambda_epsilon = 100.0
    pbf_num_iters = 5
    corr_deltaQ_coeff = 0.3
    corrK = 0.001
    neighbor_radius = h_ * 1.05
    poly6_factor = 315.0 / 64.0 / math.pi
    spiky_grad_factor = -45.0 / math.pi

    old_positions = ti.Vector.field(dim, float)
    positions = ti.Vector.field(dim, float)
    velocities = ti.Vector.field(dim, float)
    grid_num_particles = ti.field(int)
    grid2particles = ti.field(int)
    particle_num_neighbors = ti.field(int)
    particle_neighbors = ti.field(int)
    lambdas = ti.field(float)
    position_deltas = ti.Vector.field(dim, float)
    board_states = ti.Vector.field(2, float)
    ti.root.dense(ti.i, num_particles).place(old_positions, positions, velocities)
    grid_snode = ti.root.dense(ti.ij, grid_size)
    grid_snode.place(grid_num_particles)
    grid_snode.dense(ti.k, max_num_particles_per_cell).place(grid2particles)
    nb_node = ti.root.dense(ti.i, num_particles)
    nb_node.place(particle_num_neighbors)
    nb_node.dense(ti.j, max_num_neighbors).place(particle_neighbors)
    ti.root.dense(ti.i, num_particles).place(lambdas, position_deltas)
    ti.root.place(board_states)

    @ti.func
    def poly6_value(s, h):
        result = 0.0
        if 0 < s and s < h:
            x = (h * h - s * s) / (h * h * h)
            result = poly6_factor * x * x * x
        return result

    @ti.func
    def spiky_gradient(r, h):
        result = ti.Vector([0.0, 0.0])
        r_len = r.norm()
        if 0 < r_len and r_len < h:
            x = (h - r_len) / (h * h * h)
            g_factor = spiky_grad_factor * x * x
            result = r * g_factor / r_len
        return result

    @ti.func
    def compute_scorr(pos_ji):
        x = poly6_value(pos_ji.norm(), h_) / poly6_value(corr_deltaQ_coeff * h_, h_)
        x = x * x
        x = x * x
        return (-corrK) * x

    @ti.func
    def get_cell(pos):
        return int(pos * cell_recpr)

    @ti.func
    def is_in_grid(c):
        return 0 <= c[0] and c[0] < grid_size[0] and 0 <= c[1] and c[1] < grid_size[1]

    @ti.func
    def confine_position_to_boundary(p):
        bmin = particle_radius_in_world
        bmax = ti.Vector([board_states[None][0], boundary[1]]) - particle_radius_in_world
        for i in ti.static(range(dim)):
            if p[i] <= bmin:
                p[i] = bmin + epsilon * ti.random()
            elif bmax[i] <= p[i]:
                p[i] = bmax[i] - epsilon * ti.random()
        return p

    @ti.kernel
    def move_board():
        b = board_states[None]
        b[1] += 1.0
        period = 90
        vel_strength = 8.0
        if b[1] >= 2 * period:
            b[1] = 0
        b[0] += -ti.sin(b[1] * math.pi / period) * vel_strength * time_delta
        board_states[None] = b

    @ti.kernel
    def prologue():
        for i in positions:
            old_positions[i] = positions[i]
        for i in positions:
            g = ti.Vector([0.0, -9.8])
            pos, vel = positions[i], velocities[i]
            vel += g * time_delta
            pos += vel * time_delta
            positions[i] = confine_position_to_boundary(pos)
        for I in ti.grouped(grid_num_particles):
            grid_num_particles[I] = 0
        for I in ti.grouped(particle_neighbors):
            particle_neighbors[I] = -1
        for p_i in positions:
            cell = get_cell(positions[p_i])
            offs = ti.atomic_add(grid_num_particles[cell], 1)
            grid2particles[cell, offs] = p_i
        for p_i in positions:
            pos_i = positions[p_i]
            cell = get_cell(pos_i)
            nb_i = 0
            for offs in ti.static(ti.grouped(ti.ndrange((-1, 2), (-1, 2)))):
                cell_to_check = cell + offs
                if is_in_grid(cell_to_check):
                    for j in range(grid_num_particles[cell_to_check]):
                        p_j = grid2particles[cell_to_check, j]
                        if nb_i < max_num_neighbors and p_j != p_i and \
                                (pos_i - positions[p_j]).norm() < neighbor_radius:
                            particle_neighbors[p_i, nb_i] = p_j
                            nb_i += 1
            particle_num_neighbors[p_i] = nb_i

    @ti.kernel
    def substep():
        for p_i in positions:
            pos_i = positions[p_i]
            grad_i = ti.Vector([0.0, 0.0])
            sum_gradient_sqr = 0.0
            density_constraint = 0.0
            for j in range(particle_num_neighbors[p_i]):
                p_j = particle_neighbors[p_i, j]
                if p_j < 0:
                    break
                pos_ji = pos_i - positions[p_j]
                grad_j = spiky_gradient(pos_ji, h_)
                grad_i += grad_j
                sum_gradient_sqr += grad_j.dot(grad_j)
                density_constraint += poly6_value(pos_ji.norm(), h_)
            density_constraint = (mass * density_constraint / rho0) - 1.0
            sum_gradient_sqr += grad_i.dot(grad_i)
            lambdas[p_i] = (-density_constraint) / (sum_gradient_sqr + lambda_epsilon)
        for p_i in positions:
            pos_i = positions[p_i]
            lambda_i = lambdas[p_i]
            pos_delta_i = ti.Vector([0.0, 0.0])
            for j in range(particle_num_neighbors[p_i]):
                p_j = particle_neighbors[p_i, j]
                if p_j < 0:
                    break
                lambda_j = lambdas[p_j]
                pos_ji = pos_i - positions[p_j]
                scorr_ij = compute_scorr(pos_ji)
                pos_delta_i += (lambda_i + lambda_j + scorr_ij) * spiky_gradient(pos_ji, h_)
            pos_delta_i /= rho0
            position_deltas[p_i] = pos_delta_i
        for i in positions:
            positions[i] += position_deltas[i]

    @ti.kernel
    def epilogue():
        for i in positions:
            pos = positions[i]
            positions[i] = confine_position_to_boundary(pos)
        for i in positions:
            velocities[i] = (positions[i] - old_positions[i]) / time_delta

    @ti.kernel
    def init_particles():
        for i in range(num_particles):
            delta = h_ * 0.8
            offs = ti.Vector([(boundary[0] - delta * num_particles_x) * 0.5, boundary[1] * 0.02])
            positions[i] = ti.Vector([i % num_particles_x, i // num_particles_x]) * delta + offs
            velocities[i] = [(hash01(2 * i) - 0.5) * 4, (hash01(2 * i + 1) - 0.5) * 4]
        board_states[None] = ti.Vector([boundary[0] - epsilon, -0.0])

    def step():
        move_board()
        prologue()
        for _ in range(pbf_num_iters):
            substep()
        epilogue()

    return {"setup": init_particles, "step": step, "fields": {"positions": positions}, "rtol": 1e-3}
