"""The table of bench/ckpt_compare.sh: medians over the rounds of each
phase's wall seconds and CPU seconds (all threads), base against new, and
GB/s of session state over each.

  python3 bench/ckpt_compare.py LOGDIR
"""
import glob
import os
import re
import statistics
import sys

ENGINE = re.compile(r"^((?:checkpoint|verify|restore|resume).*?)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)"
                    r"(\s+\(.*)?$")
SERVICE = re.compile(r"^\s+(\w+)\s+([0-9.]+) s\s+([0-9.]+) GB/s\s+CPU\s+([0-9.]+) s")
STATE = re.compile(r"^(?:state|session state) ([0-9.]+) GB")


def parse(path, service):
    rows, gb = {}, None
    with open(path) as f:
        for line in f:
            m = STATE.match(line)
            if m:
                gb = float(m.group(1))
            m = (SERVICE if service else ENGINE).match(line)
            if not m:
                continue
            if service:
                rows[m.group(1)] = (float(m.group(2)), float(m.group(4)))
            else:
                rows[m.group(1)] = (float(m.group(2)), float(m.group(4)))
    return rows, gb


def main():
    logs = sys.argv[1]
    for kind in ["engine", "service-process", "service-thread"]:
        runs = {"base": [], "new": []}
        gb = None
        for side in runs:
            for p in sorted(glob.glob(os.path.join(logs, f"{kind}.{side}.*"))):
                rows, g = parse(p, kind != "engine")
                gb = g or gb
                if rows:
                    runs[side].append(rows)
                else:
                    print(f"{p}: no figures (see the log)")
        if not gb:
            continue
        print(f"\n{kind} ({gb:.3f} GB; medians of {len(runs['base'])} / {len(runs['new'])} runs)")
        print(f"{'phase':48s} {'base s':>8s} {'GB/s':>6s} {'CPU s':>7s} | "
              f"{'new s':>8s} {'GB/s':>6s} {'CPU s':>7s} {'GB/CPU-s':>8s}")
        labels = []
        for side in runs:
            for rows in runs[side]:
                labels += [k for k in rows if k not in labels]
        for k in labels:
            cells = []
            for side in runs:
                w = [r[k][0] for r in runs[side] if k in r]
                c = [r[k][1] for r in runs[side] if k in r]
                if w:
                    mw, mc = statistics.median(w), statistics.median(c)
                    cells.append(f"{mw:8.3f} {gb / mw:6.2f} {mc:7.3f}")
                    last = gb / mc if mc else 0.0
                else:
                    cells.append(f"{'-':>8s} {'-':>6s} {'-':>7s}")
                    last = None
            tail = f" {last:8.2f}" if last else ""
            print(f"{k[:48]:48s} {cells[0]} | {cells[1]}{tail}")


main()
