"""real/game_of_life (bench/real/game_of_life.json): Taichi's
examples/simulation/game_of_life.py, 64 x 64, a step is 100 generations
(run() as the example writes it); seeded by the same integer hash as the
.fbk instead of ti.random() > 0.8."""
import taichi as ti  # also a global: Taichi 0.7 compiles ti.func bodies against module globals
from real_mpm88 import hash01


def make(ti, n=64):
    alive = ti.field(int, shape=(n, n))
    count = ti.field(int, shape=(n, n))

    @ti.func
    def get_alive(i, j):
        return alive[i, j] if 0 <= i < n and 0 <= j < n else 0

    @ti.func
    def get_count(i, j):
        return (get_alive(i - 1, j) + get_alive(i + 1, j) + get_alive(i, j - 1) + get_alive(i, j + 1)
                + get_alive(i - 1, j - 1) + get_alive(i + 1, j - 1) + get_alive(i - 1, j + 1)
                + get_alive(i + 1, j + 1))

    @ti.func
    def calc_rule(a, c):
        if a == 0:
            for t in ti.static([3]):
                if c == t:
                    a = 1
        elif a == 1:
            a = 0
            for t in ti.static([2, 3]):
                if c == t:
                    a = 1
        return a

    @ti.kernel
    def run():
        for i, j in alive:
            count[i, j] = get_count(i, j)
        for i, j in alive:
            alive[i, j] = calc_rule(alive[i, j], count[i, j])

    @ti.kernel
    def init():
        for i, j in alive:
            if hash01(i * n + j) > 0.8:
                alive[i, j] = 1
            else:
                alive[i, j] = 0

    def step():
        for _ in range(100):
            run()

    return {"setup": init, "step": step, "fields": {"alive": alive, "count": count}, "rtol": 0.0}
