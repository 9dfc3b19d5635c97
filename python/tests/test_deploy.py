"""deploy/ as far as it can be checked without a cluster: every manifest
and the Helm chart's templates (rendered here for its default values and
with every switch on) are YAML that parses into the kinds expected, with a
GPU request, the TLS and tenants Secrets, a drain on preStop and a
termination grace longer than the drain's; and every fuseboxd flag that
deploy/ uses (manifests, chart, the config file's keys, the unit's ExecStart) is one that `fuseboxd --help` lists."""
import glob
import os
import re
import subprocess

import pytest

from conftest import FUSEBOXD, ROOT

yaml = pytest.importorskip("yaml") if os.environ.get("CI") != "true" else __import__("yaml")
DEPLOY = os.path.join(ROOT, "deploy")
CHART = os.path.join(DEPLOY, "helm", "fusebox")


def lookup(ctx, path):
    v = ctx
    for part in path.split("."):
        assert isinstance(v, dict) and part in v, f"no value {path}"
        v = v[part]
    return v


def render(text, values, release="test"):
    """The subset of Helm's templates the chart uses: {{ .Values.a.b }},
    {{ .Release.Name }}, {{- if .Values.x }} ... {{- end }} (not nested)."""
    ctx = {"Values": values, "Release": {"Name": release}}

    def cond(m):
        return m.group(2) if lookup(ctx, m.group(1)) else ""
    text = re.sub(r"\{\{-? if \.(\S+) \}\}\n?(.*?)\{\{-? end \}\}\n?", cond, text, flags=re.S)
    text = re.sub(r"\{\{ \.(\S+) \}\}", lambda m: str(lookup(ctx, m.group(1))), text)
    assert "{{" not in text, text
    return text


def chart_docs(values):
    docs = []
    for t in sorted(glob.glob(os.path.join(CHART, "templates", "*.yaml"))):
        with open(t) as f:
            docs += [d for d in yaml.safe_load_all(render(f.read(), values)) if d]
    return docs


def default_values():
    with open(os.path.join(CHART, "values.yaml")) as f:
        return yaml.safe_load(f)


def flags_of(args):
    return {a for a in args if isinstance(a, str) and a.startswith("--")}


def check_pod(spec, drain_flag_index=True):
    c = spec["template"]["spec"]["containers"][0]
    args = [str(a) for a in c["args"]]
    grace = float(args[args.index("--drain-grace-s") + 1])
    shut = float(args[args.index("--shutdown-grace-s") + 1])
    assert spec["template"]["spec"]["terminationGracePeriodSeconds"] > grace + shut
    assert "kill -TERM 1" in " ".join(c["lifecycle"]["preStop"]["exec"]["command"])
    assert int(c["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    secrets = {v["secret"]["secretName"] for v in spec["template"]["spec"]["volumes"]}
    assert len(secrets) == 2  # TLS and tenants
    assert args[args.index("--replica-name") + 1] == "$(POD_NAME)"
    return flags_of(args)


def test_manifests_parse_and_drain():
    kinds = {}
    for p in glob.glob(os.path.join(DEPLOY, "k8s", "*.yaml")):
        with open(p) as f:
            for d in yaml.safe_load_all(f):
                kinds.setdefault(d["kind"], []).append(d)
    (sts,) = kinds["StatefulSet"]
    check_pod(sts["spec"])
    assert any(s["spec"].get("clusterIP") == "None" for s in kinds["Service"])
    assert kinds["PodDisruptionBudget"]


def test_chart_renders():
    v = default_values()
    docs = chart_docs(v)
    kinds = {d["kind"] for d in docs}
    assert kinds == {"StatefulSet", "Service", "PodDisruptionBudget"}, kinds
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    assert sts["spec"]["replicas"] == v["replicas"]
    assert sts["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    check_pod(sts["spec"])
    v["metrics"] = {"annotations": False, "serviceMonitor": True}
    docs = chart_docs(v)
    assert "ServiceMonitor" in {d["kind"] for d in docs}
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    assert "annotations" not in sts["spec"]["template"]["metadata"]
    # a drain grace the termination grace does not outlast is caught
    v["drainGraceS"] = v["terminationGracePeriodSeconds"]
    sts = next(d for d in chart_docs(v) if d["kind"] == "StatefulSet")
    with pytest.raises(AssertionError):
        check_pod(sts["spec"])


def test_every_flag_exists():
    help_text = subprocess.run([FUSEBOXD, "--help"], capture_output=True, text=True,
                               timeout=30).stdout
    known = set(re.findall(r"^\s+(--[a-z0-9-]+)", help_text, flags=re.M))
    assert "--drain-grace-s" in known and "--replica-name" in known
    used = set()
    for p in glob.glob(os.path.join(DEPLOY, "k8s", "*.yaml")):
        with open(p) as f:
            for d in yaml.safe_load_all(f):
                for c in (d.get("spec", {}).get("template", {}).get("spec", {})
                          .get("containers", [])):
                    used |= flags_of(c.get("args", []))
    sts = next(d for d in chart_docs(default_values()) if d["kind"] == "StatefulSet")
    used |= flags_of(sts["spec"]["template"]["spec"]["containers"][0]["args"])
    import json
    with open(os.path.join(DEPLOY, "fuseboxd.json")) as f:  # keys are flags with '_'
        used |= {"--" + k.replace("_", "-") for k in json.load(f)}
    with open(os.path.join(DEPLOY, "fuseboxd.service")) as f:
        for line in f:
            if line.startswith("ExecStart=") and "fuseboxd" in line:
                used |= set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]+)", line))
    unknown = sorted(f for f in used if f not in known)
    assert not unknown, f"flags deploy/ uses that fuseboxd --help does not list: {unknown}"
