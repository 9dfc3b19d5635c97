"""real/waterwave (bench/real/waterwave.json): Taichi's
examples/simulation/waterwave.py at 512 x 512; setup drops two waves at
fixed places (the example waits for clicks), a step is 10 frames of
update() + visualize_wave(), as the example's loop runs them."""
import taichi as ti  # also a global: Taichi 0.7 compiles ti.func bodies against module globals


def make(ti, n=512):
    light_color = 1
    gravity = 2.0
    damping = 0.2
    dx = 0.02
    dt = 0.01
    shape = n, n
    pixels = ti.field(dtype=float, shape=shape)
    background = ti.field(dtype=float, shape=shape)
    height = ti.field(dtype=float, shape=shape)
    velocity = ti.field(dtype=float, shape=shape)

    @ti.kernel
    def reset():
        for i, j in height:
            t = i // 16 + j // 16
            if t % 2 == 0:
                background[i, j] = 0.0
            else:
                background[i, j] = 0.25
            height[i, j] = 0
            velocity[i, j] = 0

    @ti.func
    def laplacian(i, j):
        return (-4 * height[i, j] + height[i, j - 1] + height[i, j + 1] + height[i + 1, j]
                + height[i - 1, j]) / (4 * dx ** 2)

    @ti.func
    def gradient(i, j):
        return ti.Vector([
            (height[i + 1, j] if i < shape[0] - 1 else 0) - (height[i - 1, j] if i > 1 else 0),
            (height[i, j + 1] if j < shape[1] - 1 else 0) - (height[i, j - 1] if j > 1 else 0),
        ]) * (0.5 / dx)

    @ti.kernel
    def create_wave(amplitude: ti.f32, x: ti.f32, y: ti.f32):
        for i, j in ti.ndrange((1, shape[0] - 1), (1, shape[1] - 1)):
            r2 = (i - x) ** 2 + (j - y) ** 2
            height[i, j] = height[i, j] + amplitude * ti.exp(-0.02 * r2)

    @ti.kernel
    def update():
        for i, j in ti.ndrange((1, shape[0] - 1), (1, shape[1] - 1)):
            acceleration = gravity * laplacian(i, j) - damping * velocity[i, j]
            velocity[i, j] = velocity[i, j] + acceleration * dt
        for i, j in ti.ndrange((1, shape[0] - 1), (1, shape[1] - 1)):
            height[i, j] = height[i, j] + velocity[i, j] * dt

    @ti.kernel
    def visualize_wave():
        for i, j in pixels:
            g = gradient(i, j)
            cos_i = 1 / ti.sqrt(1 + g.norm_sqr())
            brightness = pow(1 - cos_i, 2)
            color = background[i, j]
            pixels[i, j] = (1 - brightness) * color + brightness * light_color

    def setup():
        reset()
        create_wave(3, 200, 300)
        create_wave(3, 350, 150)

    def step():
        for _ in range(10):
            update()
            visualize_wave()

    return {"setup": setup, "step": step,
            "fields": {"height": height, "velocity": velocity, "pixels": pixels}}
