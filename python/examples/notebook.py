# %% [markdown]
# # Fusebox from a notebook
# A notebook-style script (cells marked `# %%`, as Jupyter and VS Code read
# them): run the heat example, look at the plate as an image, then compare
# sync and async mode with `fusebox.bench`. Run it as a script too:
#
#     python3 python/examples/notebook.py [--out heat.png]

# %%
import argparse
import os

import numpy as np

import fusebox

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "..", "examples")
ap = argparse.ArgumentParser()
ap.add_argument("--out", default="heat.png", help="where to save the image")
args, _ = ap.parse_known_args()

# %% A session: the hot disk spreads over the plate.
fb = fusebox.connect()
s = fb.session(file=os.path.join(EXAMPLES, "heat.fbk"), mode="async")
s.kernels.init()
for _ in range(200):
    s.kernels.step(s.fields.T, s.fields.U, k=0.2)
    s.kernels.step(s.fields.U, s.fields.T, k=0.2)
T = s.fields.T.to_numpy()
print("total heat", T.sum(), "hottest", T.max(), "at", np.unravel_index(T.argmax(), T.shape))

# %% The plate as an image: a PNG written by the package itself (no
# matplotlib), viridis over the field's range, T[i, j] at x = i, y = j upward
# as Taichi's GUI shows it.
fusebox.write_png(args.out, s.fields.T, colormap="viridis", orientation="taichi")
print("saved", args.out)

# %% Sync against async: the same work, different launch overhead.
rows = fusebox.bench(os.path.join(EXAMPLES, "heat.json"), modes=["sync", "async"], warmup=1,
                     repeat=3, server=fb)
for r in rows:
    print(f"{r['mode']:6} wall {r['wall_s'] * 1e3:8.2f} ms/step  tasks {r['tasks_launched']:4}  "
          f"checks {'ok' if r['checks_passed'] else 'FAILED'}")

# %%
s.close()
fb.close()
