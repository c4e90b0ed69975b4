"""Render a kustomization for the deploy tests.

`kubectl kustomize` (kustomize v5) when it is installed; otherwise a small assembler for
the subset this repository uses (resources, namespace, labels, images and JSON 6902
patches), so the tests still render the real files on a machine without kubectl. Where
kubectl exists, a test checks that both give the same objects.
"""
import copy
import json
import os
import shutil
import subprocess

import yaml

CLUSTER_SCOPED = ("Namespace", "ClusterRole", "ClusterRoleBinding")  # kustomize leaves them


def render(path):
    if shutil.which("kubectl"):
        return render_kubectl(path)
    return render_python(path)


def render_kubectl(path):
    out = subprocess.run(["kubectl", "kustomize", path], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    return [o for o in yaml.safe_load_all(out) if o]


def _load_kustomization(path):
    with open(os.path.join(path, "kustomization.yaml")) as f:
        return yaml.safe_load(f)


def render_python(path):
    k = _load_kustomization(path)
    objects = []
    for res in k.get("resources", []):
        full = os.path.normpath(os.path.join(path, res))
        if os.path.isdir(full):
            objects.extend(render_python(full))
        else:
            with open(full) as f:
                objects.extend(o for o in yaml.safe_load_all(f) if o)
    for patch in k.get("patches", []):
        ops = yaml.safe_load(patch["patch"])
        target = patch["target"]
        for obj in objects:
            if obj["kind"] == target.get("kind") and obj["metadata"]["name"] == target.get("name"):
                for op in ops:
                    _json_patch(obj, op)
    for obj in objects:
        if "namespace" in k and obj["kind"] not in CLUSTER_SCOPED:
            obj["metadata"]["namespace"] = k["namespace"]
        for entry in k.get("labels", []):
            obj["metadata"].setdefault("labels", {}).update(entry["pairs"])
        for image in k.get("images", []):
            for c in _containers(obj):
                if c["image"] == image["name"]:
                    c["image"] = "%s:%s" % (image.get("newName", image["name"]), image["newTag"])
    return objects


def _containers(obj):
    spec = obj.get("spec", {}).get("template", {}).get("spec", {})
    return spec.get("containers", []) + spec.get("initContainers", [])


def _json_patch(obj, op):
    parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
    parent = obj
    for p in parts[:-1]:
        parent = parent[int(p)] if isinstance(parent, list) else parent[p]
    last = parts[-1]
    if op["op"] not in ("add", "replace"):
        raise NotImplementedError(op["op"])
    value = copy.deepcopy(op["value"])
    if isinstance(parent, list):
        if last == "-":
            parent.append(value)
        else:
            parent.insert(int(last), value) if op["op"] == "add" else parent.__setitem__(int(last), value)
    else:
        parent[last] = value


def canonical(objects):
    return sorted(json.dumps(o, sort_keys=True) for o in objects)
