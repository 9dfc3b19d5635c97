"""The GPU check (scripts/gpu_check.sh runs it; docs/gpu.md).

Standard library only: the GPU machines it is for have Python and nothing
else. Every step runs in its own process group under its own time limit,
cut to what is left of the whole budget; a step that cannot fit is skipped
with the reason. The report files are rewritten after every step, so they
exist however the run ends.
"""
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("FB_BUILD_DIR") or os.path.join(ROOT, "build")
FAKE_LIB = os.path.join(BUILD, "tests", "fakecuda", "libfakecuda.so")
# The suites of the CUDA half (tests/CMakeLists.txt, the *_cuda entries).
CUDA_HALF = ["test_engine", "test_lang_exec", "test_sparse", "test_async", "test_reduce"]
REPORT_RESERVE_S = 8  # kept back for the last report


def usage(msg):
    sys.stderr.write("gpu_check: %s\nusage: gpu_check.sh OUTDIR [--fake] [--budget SECONDS] "
                     "[--only STEP,...] [--logs DIR]\n" % msg)
    sys.exit(2)


class Check:
    def __init__(self, out, fake, budget, only, logs):
        self.out = out
        self.logs = logs
        self.fake = fake
        self.budget = budget
        self.only = only
        self.t0 = time.monotonic()
        self.steps = []
        self.info = {}
        self.env = dict(os.environ)
        self.env["FB_BUILD_DIR"] = BUILD
        self.env["FB_TEST_DIR"] = os.path.join(ROOT, "tests")
        if fake:
            self.env["FB_CUDA_LIBRARY"] = FAKE_LIB
        self.server = None
        self.sock = "/tmp/fb_gpu_check_%d.sock" % os.getpid()

    # ------------------------------------------------------------ plumbing
    def left(self):
        return self.budget - (time.monotonic() - self.t0)

    def log(self, text):
        print("[%4.0fs] %s" % (time.monotonic() - self.t0, text), flush=True)

    def wanted(self, name):
        return not self.only or any(name == o or name.startswith(o + "/") for o in self.only)

    def record(self, name, status, seconds=0.0, reason="", figures=None, log_tail=""):
        step = {"step": name, "status": status, "seconds": round(seconds, 2)}
        if reason:
            step["reason"] = reason
        if figures:
            step["figures"] = figures
        if log_tail and status != "pass":
            step["log_tail"] = log_tail
        self.steps.append(step)
        extra = (": " + reason) if reason else ""
        self.log("%-34s %s (%.1f s)%s" % (name, status.upper(), seconds, extra))
        self.write()
        return step

    def run(self, name, cmd, limit, env=None, cwd=None, need=5):
        """Runs cmd with a time limit cut to the budget. Returns (status,
        seconds, output, reason) with status pass, fail, timeout or skip."""
        avail = self.left() - REPORT_RESERVE_S
        if avail < need:
            return "skip", 0.0, "", "over budget: %.0f s left, the step needs about %d s" % (
                max(avail, 0), need)
        limit = min(limit, avail)
        t = time.monotonic()
        logf = os.path.join(self.logs, name.replace("/", "_") + ".log")
        with open(logf, "wb") as lf:
            try:
                p = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, env=env or self.env,
                                     cwd=cwd or ROOT, start_new_session=True)
            except OSError as e:
                return "fail", 0.0, "", "cannot start %s: %s" % (cmd[0], e)
            try:
                rc = p.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                kill_group(p)
                rc = None
        secs = time.monotonic() - t
        with open(logf, "rb") as lf:
            output = lf.read().decode("utf-8", "replace")
        if rc is None:
            return "timeout", secs, output, "stopped after its %.0f s limit" % limit
        if rc == 77:
            return "skip", secs, output, first_line(output, "half skipped") or "exit 77"
        if rc != 0:
            return "fail", secs, output, "exit status %d" % rc
        return "pass", secs, output, ""

    # ------------------------------------------------------------- reports
    def write(self):
        failures = [s for s in self.steps if s["status"] in ("fail", "timeout")]
        doc = {
            "ok": not failures and any(s["status"] == "pass" for s in self.steps),
            "mode": "fake CUDA driver" if self.fake else "GPU",
            "command": " ".join(["gpu_check.sh"] + sys.argv[1:]),
            "elapsed_s": round(time.monotonic() - self.t0, 1),
            "budget_s": self.budget,
            **self.info,
            "steps": self.steps,
            "failures": [{"step": s["step"], "message": s.get("reason", ""),
                          "log_tail": s.get("log_tail", "")} for s in failures],
        }
        tmp = os.path.join(self.out, "gpu_check.json.tmp")
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
        os.replace(tmp, os.path.join(self.out, "gpu_check.json"))
        tmp = os.path.join(self.out, "gpu_check.md.tmp")
        with open(tmp, "w") as f:
            f.write(markdown(doc))
        os.replace(tmp, os.path.join(self.out, "gpu_check.md"))

    # --------------------------------------------------------------- steps
    def preflight(self):
        t = time.monotonic()
        bundle = {}
        try:
            with open(os.path.join(ROOT, "BUNDLE")) as f:
                for line in f:
                    k, _, v = line.strip().partition(" ")
                    bundle[k] = v
        except OSError:
            bundle["commit"] = sh(["git", "-C", ROOT, "rev-parse", "HEAD"]) or "unknown"
        self.info["commit"] = bundle.get("commit", "unknown")
        self.info["bundle"] = bundle
        self.info["date"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        self.info["host"] = {"uname": " ".join(os.uname()), "cores": os.cpu_count(),
                             "glibc": " ".join(os.confstr("CS_GNU_LIBC_VERSION").split()[1:])}
        dev = {}
        smi = sh(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_cap",
                  "--format=csv,noheader"])
        if smi:
            parts = [p.strip() for p in smi.splitlines()[0].split(",")]
            for k, v in zip(["name", "driver", "memory", "compute_capability"], parts):
                dev[k] = v
            cuda = re.search(r"CUDA Version:\s*([\d.]+)", sh(["nvidia-smi"]) or "")
            if cuda:
                dev["cuda"] = cuda.group(1)
        else:
            dev["nvidia_smi"] = "not found" if not shutil.which("nvidia-smi") else "failed"
        if self.fake:
            dev["name"] = "fake CUDA driver (tests/fakecuda): runs no kernel"
        self.info["device"] = dev
        ptxas = shutil.which("ptxas") or ("/usr/local/cuda/bin/ptxas"
                                          if os.path.exists("/usr/local/cuda/bin/ptxas") else "")
        self.info["ptxas"] = ptxas or "not found"
        libdev = ([os.environ["FB_LIBDEVICE"]] if os.environ.get("FB_LIBDEVICE") else
                  [os.path.join(h, "nvvm/libdevice/libdevice.10.bc")
                   for h in (os.environ.get("CUDA_HOME"), "/usr/local/cuda") if h])
        self.info["libdevice"] = next((x for x in libdev if os.path.exists(x)),
                                      "not found (math functions cannot compile for the GPU)")
        # Every program must find every library (from the bundle's lib/).
        missing = []
        progs = [os.path.join(BUILD, p) for p in ("server/fuseboxd", "client/fusebox",
                                                  "bench/gpu_launch_bench")]
        progs += sorted(glob.glob(os.path.join(BUILD, "tests", "test_*")))
        for p in progs:
            if not os.path.exists(p):
                missing.append("%s: missing" % os.path.relpath(p, ROOT))
                continue
            for line in (sh(["ldd", p]) or "").splitlines():
                if "not found" in line:
                    missing.append("%s: %s" % (os.path.relpath(p, ROOT), line.strip()))
        fig = {"device": dev.get("name", "?"), "driver": dev.get("driver", "?")}
        if missing:
            self.record("preflight", "fail", time.monotonic() - t, "%d libraries or programs "
                        "missing" % len(missing), fig, "\n".join(missing[:40]))
        else:
            self.record("preflight", "pass", time.monotonic() - t, "", fig)

    def launch_bench(self):
        name = "gpu_launch_bench"
        if not self.wanted(name):
            return
        n = "2000" if self.fake else "20000"
        st, secs, out, why = self.run(name, [os.path.join(BUILD, "bench/gpu_launch_bench"), n], 60)
        fig = {}
        m = re.search(r"bare cuLaunchKernel loop\s+([\d.]+) us", out)
        if m:
            fig["bare_us"] = float(m.group(1))
        for key, pat in (("async", r"engine, async \(no passes\)"), ("sync", r"engine, sync")):
            m = re.search(pat + r"\s+([\d.]+) us/launch\s+([\d.]+)x bare", out)
            if m:
                fig[key + "_us"] = float(m.group(1))
                fig[key + "_over_bare"] = float(m.group(2))
        m = re.search(r"device: (.*)", out)
        if m:
            fig["engine_device"] = m.group(1).strip()
        if st == "pass" and "no GPU here" in out:
            st, why = "fail", first_line(out, "no GPU here")
        elif st == "pass" and "async_us" not in fig:
            st, why = "fail", "no figures in its output"
        self.record(name, st, secs, why, fig, tail(out))

    def start_server(self, backend):
        self.stop_server()
        logf = open(os.path.join(self.logs, "fuseboxd_%s.log" % backend), "wb")
        try:
            os.unlink(self.sock)
        except OSError:
            pass
        self.server = subprocess.Popen(
            [os.path.join(BUILD, "server/fuseboxd"), "--backend", backend,
             "--listen", "unix:" + self.sock], stdout=logf, stderr=subprocess.STDOUT,
            env=self.env, cwd=ROOT, start_new_session=True)
        self.server_log = logf.name
        fusebox = os.path.join(BUILD, "client/fusebox")
        for _ in range(100):
            if self.server.poll() is not None:
                break
            if os.path.exists(self.sock) and subprocess.run(
                    [fusebox, "ping", "--server", "unix:" + self.sock], env=self.env,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0:
                return ""
            time.sleep(0.2)
        with open(self.server_log, "rb") as f:
            text = f.read().decode("utf-8", "replace")
        self.stop_server()
        return "fuseboxd --backend %s did not start:\n%s" % (backend, text[-3000:])

    def stop_server(self):
        if self.server:
            if self.server.poll() is None:
                self.server.terminate()
                try:
                    self.server.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    kill_group(self.server)
            self.server = None

    def examples(self, backend, modes, expect_pass, group):
        files = sorted(glob.glob(os.path.join(ROOT, "examples", "*.json")))
        names = ["%s/%s_%s" % (group, os.path.basename(f)[:-5], m) for f in files for m in modes]
        if not any(self.wanted(n) for n in names):
            return
        if self.left() - REPORT_RESERVE_S < 20:
            for n in names:
                if self.wanted(n):
                    self.record(n, "skip", 0, "over budget: %.0f s left" % self.left())
            return
        err = self.start_server(backend)
        if err:
            self.record(group + "/fuseboxd", "fail", 0, "fuseboxd did not start", None, err)
            return
        fusebox = os.path.join(BUILD, "client/fusebox")
        try:
            for f in files:
                for m in modes:
                    name = "%s/%s_%s" % (group, os.path.basename(f)[:-5], m)
                    if not self.wanted(name):
                        continue
                    odir = os.path.join(self.logs, "frames")
                    st, secs, out, why = self.run(
                        name, [fusebox, "run", f, "--server", "unix:" + self.sock, "--mode", m,
                               "--json", "-q", "-o", odir], 60)
                    fig = {}
                    try:
                        # the report is the first line that is a lone "{"
                        # (a warning before it may quote the layout's braces)
                        j = json.loads(out[re.search(r"^\{$", out, re.M).start():])
                        fig = {"outcome": j.get("outcome"), "backend": j.get("backend"),
                               "elapsed_s": j.get("elapsed_s")}
                    except (ValueError, AttributeError):
                        j = None
                    if j and fig["backend"] != backend and st in ("pass", "fail"):
                        st, why = "fail", "ran on %s, not %s" % (fig["backend"], backend)
                    elif not expect_pass and j and st == "fail" and j.get("outcome") == "failed":
                        # The fake driver runs no kernel: the session must run
                        # (compile, launch, read back); its checks cannot pass.
                        st, why = "pass", "ran; checks fail as expected (the fake runs no kernel)"
                    self.record(name, st, secs, why, fig, tail(out))
        finally:
            self.stop_server()

    def suites(self):
        """The CUDA half, all suites at once (a GPU machine has the cores)."""
        jobs = []
        if self.fake:
            env = dict(self.env, CK_DEFAULT_TIMEOUT="300")
            jobs.append(("cuda_half/test_cuda", ["test_cuda"], env, 150))
            env = dict(self.env, FB_TEST_BACKEND="cuda", FB_DIFF_FAKE_DEVICE="1", FB_DIFF_BIG="2",
                       CK_RUN_CASE="big", CK_DEFAULT_TIMEOUT="300")
            jobs.append(("differential/big_fake", ["test_differential"], env, 150))
        else:
            env = dict(self.env, FB_TEST_BACKEND="cuda", CK_DEFAULT_TIMEOUT="300")
            env.pop("FB_CUDA_LIBRARY", None)
            for s in CUDA_HALF:
                jobs.append(("cuda_half/" + s, [s], env, 170))
            jobs.append(("differential/cuda", ["test_differential"], env, 170))
            penv = dict(env)
            penv.pop("FB_TEST_BACKEND")
            jobs.append(("cuda_half/test_ptx", ["test_ptx"], penv, 60))
            fenv = dict(env, FB_CUDA_LIBRARY=FAKE_LIB)
            jobs.append(("cuda_half/test_cuda", ["test_cuda"], fenv, 120))
        jobs = [j for j in jobs if self.wanted(j[0])]
        if not jobs:
            return
        avail = self.left() - REPORT_RESERVE_S
        if avail < 30:
            for j in jobs:
                self.record(j[0], "skip", 0, "over budget: %.0f s left" % max(avail, 0))
            return
        self.log("running %d suites at once (each up to %.0f s)" % (
            len(jobs), min(max(j[3] for j in jobs), avail)))
        running = []
        for name, cmd, env, limit in jobs:
            logf = os.path.join(self.logs, name.replace("/", "_") + ".log")
            lf = open(logf, "wb")
            p = subprocess.Popen([os.path.join(BUILD, "tests", cmd[0])] + cmd[1:], stdout=lf,
                                 stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                 start_new_session=True)
            running.append([name, p, lf, logf, time.monotonic(), min(limit, avail)])
        while running:
            time.sleep(0.2)
            for r in list(running):
                name, p, lf, logf, t, limit = r
                rc = p.poll()
                over = time.monotonic() - t > limit
                if rc is None and not over:
                    continue
                if rc is None:
                    kill_group(p)
                lf.close()
                running.remove(r)
                with open(logf, "rb") as f:
                    out = f.read().decode("utf-8", "replace")
                secs = time.monotonic() - t
                fig = {}
                m = re.search(r"(\d+)%: Checks: (\d+), Failures: (\d+), Errors: (\d+)", out)
                if m:
                    fig = {"checks": int(m.group(2)), "failures": int(m.group(3)),
                           "errors": int(m.group(4))}
                if rc is None:
                    st, why = "timeout", "stopped after its %.0f s limit" % limit
                elif rc == 77:
                    st, why = "skip", first_line(out, "half skipped") or "exit 77"
                    if not self.fake:
                        st = "fail"  # on a GPU machine the CUDA half must run
                elif rc != 0:
                    st, why = "fail", "exit status %d" % rc
                else:
                    st, why = "pass", ""
                self.record(name, st, secs, why, fig, tail(out, 60))

    def bench(self, group, pattern, per_file, step_limit):
        files = sorted(glob.glob(os.path.join(ROOT, pattern)))
        names = ["%s/%s" % (group, os.path.basename(f)[:-5]) for f in files]
        todo = [(n, f) for n, f in zip(names, files) if self.wanted(n)]
        if not todo:
            return
        if self.fake:
            for n, _ in todo:
                self.record(n, "skip", 0, "the fake CUDA driver runs no kernel: checks cannot pass")
            return
        end = time.monotonic() + step_limit
        fusebox = os.path.join(BUILD, "client/fusebox")
        for name, f in todo:
            step_left = end - time.monotonic()
            if step_left < 10:
                self.record(name, "skip", 0, "over the %d s budget of %s" % (step_limit, group))
                continue
            jout = os.path.join(self.logs, name.replace("/", "_") + ".json")
            st, secs, out, why = self.run(
                name, [fusebox, "bench", f, "--local", "--modes", "sync,async", "--json", jout],
                min(per_file, step_left), need=10)
            fig = bench_figures(jout)
            if st == "pass" and fig.get("backend") not in ("cuda",):
                st, why = "fail", "ran on the %s backend, not cuda" % fig.get("backend")
            self.record(name, st, secs, why, fig, tail(out))

    def main(self):
        os.makedirs(self.out, exist_ok=True)
        os.makedirs(self.logs, exist_ok=True)
        self.log("Fusebox GPU check: %s, %s, budget %d s, results in %s" % (
            ROOT, "FAKE CUDA driver" if self.fake else "GPU", self.budget, self.out))
        try:
            self.preflight()
            self.launch_bench()
            if self.fake:
                self.examples("cpu", ["sync"], True, "examples_cpu")
                self.examples("cuda", ["sync", "async"], False, "examples")
            else:
                self.examples("cuda", ["sync", "async"], True, "examples")
            self.suites()
            self.bench("micro", "bench/micro/*.json", 40, 90)
            self.bench("large_gpu", "bench/large/gpu/*.json", 60, 120)
            self.bench("real_gpu", "bench/real/gpu/*.json", 40, 90)
        except KeyboardInterrupt:
            self.record("interrupted", "fail", 0, "the check was interrupted")
        finally:
            self.stop_server()
            try:
                os.unlink(self.sock)
            except OSError:
                pass
            self.write()
        doc = json.load(open(os.path.join(self.out, "gpu_check.json")))
        counts = {}
        for s in self.steps:
            counts[s["status"]] = counts.get(s["status"], 0) + 1
        self.log("done: %s; %s" % (", ".join("%d %s" % (v, k) for k, v in sorted(counts.items())),
                                   "OK" if doc["ok"] else "FAILED"))
        self.log("wrote %s and %s" % (os.path.join(self.out, "gpu_check.md"),
                                      os.path.join(self.out, "gpu_check.json")))
        return 0 if doc["ok"] else 1


def kill_group(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def sh(cmd):
    try:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return r.stdout.decode("utf-8", "replace").strip() if r.returncode == 0 else ""


def first_line(text, needle):
    for line in text.splitlines():
        if needle in line:
            return line.strip()
    return ""


def tail(text, n=40):
    return "\n".join(text.rstrip().splitlines()[-n:])


def bench_figures(path):
    try:
        with open(path) as f:
            j = json.load(f)
    except (OSError, ValueError):
        return {}
    fig = {"backend": j.get("machine", {}).get("backend")}
    for c in j.get("cases", []):
        modes = c.get("modes", {})
        for m in ("sync", "async"):
            if m in modes:
                fig[m + "_wall_s"] = round(modes[m]["wall_s"], 6)
                fig[m + "_tasks"] = round(modes[m]["tasks_per_timed_step"], 1)
        if fig.get("sync_wall_s") and "async_wall_s" in fig:
            fig["async_speedup"] = round(fig["sync_wall_s"] / max(fig["async_wall_s"], 1e-12), 2)
        fig["checks_passed"] = c.get("checks_passed")
        break  # one file, one case
    return fig


def markdown(doc):
    dev = doc.get("device", {})
    lines = ["# Fusebox GPU check", ""]
    lines.append("| | |")
    lines.append("|---|---|")
    for k, v in (("result", "**OK**" if doc["ok"] else "**FAILED**"), ("mode", doc["mode"]),
                 ("device", dev.get("name", "?")), ("driver", dev.get("driver", "?")),
                 ("CUDA (driver)", dev.get("cuda", "?")),
                 ("compute capability", dev.get("compute_capability", "?")),
                 ("memory", dev.get("memory", "?")), ("commit", doc.get("commit", "?")),
                 ("date", doc.get("date", "?")), ("command", "`%s`" % doc["command"]),
                 ("time", "%.0f s of %d s" % (doc["elapsed_s"], doc["budget_s"])),
                 ("ptxas", doc.get("ptxas", "?")), ("libdevice", doc.get("libdevice", "?"))):
        lines.append("| %s | %s |" % (k, v))
    lines += ["", "## Steps", "", "| step | result | s | figures / reason |", "|---|---|---|---|"]
    for s in doc["steps"]:
        figs = ", ".join("%s %s" % (k, v) for k, v in s.get("figures", {}).items())
        note = "; ".join(x for x in (figs, s.get("reason", "")) if x)
        lines.append("| %s | %s | %.1f | %s |" % (s["step"], s["status"], s["seconds"],
                                                  note.replace("|", "\\|")))
    benches = [s for s in doc["steps"] if "sync_wall_s" in s.get("figures", {})]
    if benches:
        lines += ["", "## Benchmarks (wall seconds per timed step)", "",
                  "| case | sync | async | sync / async | tasks sync | tasks async |",
                  "|---|---|---|---|---|---|"]
        for s in benches:
            f = s["figures"]
            lines.append("| %s | %.6f | %s | %s | %s | %s |" % (
                s["step"], f["sync_wall_s"], f.get("async_wall_s", "-"),
                f.get("async_speedup", "-"), f.get("sync_tasks", "-"), f.get("async_tasks", "-")))
    if doc["failures"]:
        lines += ["", "## Failures", ""]
        for fl in doc["failures"]:
            lines += ["### %s: %s" % (fl["step"], fl["message"]), "", "```",
                      fl.get("log_tail", "") or "(no output)", "```", ""]
    return "\n".join(lines) + "\n"


def parse(argv):
    out, fake, budget, only, logs = None, False, 480, [], None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--fake":
            fake = True
        elif a in ("--budget", "--only", "--logs"):
            if i + 1 >= len(argv):
                usage("%s needs a value" % a)
            i += 1
            if a == "--budget":
                try:
                    budget = int(argv[i])
                except ValueError:
                    usage("--budget takes whole seconds, not %r" % argv[i])
            elif a == "--logs":
                logs = os.path.abspath(argv[i])
            else:
                only = [x for x in argv[i].split(",") if x]
        elif a.startswith("-"):
            usage("unknown option %s" % a)
        elif out is None:
            out = a
        else:
            usage("one OUTDIR only (got %s and %s)" % (out, a))
        i += 1
    if not out:
        usage("OUTDIR is missing")
    out = os.path.abspath(out)
    return out, fake, budget, only, logs or os.path.join(out, "logs")


def main():
    out, fake, budget, only, logs = parse(sys.argv[1:])
    if fake and not os.path.exists(FAKE_LIB):
        usage("--fake needs the fake driver %s" % FAKE_LIB)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    return Check(out, fake, budget, only, logs).main()


if __name__ == "__main__":
    sys.exit(main())
