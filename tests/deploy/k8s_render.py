"""Renders deploy/k8s overlays with `kubectl kustomize` and finds things in the result.

Shared by k8s_manifests_test.py and k8s_daemon_args_test.py. KUBECTL names the kubectl to use
(default: kubectl on PATH); Debian 12's is 1.20, whose kustomize (v2.0.3) is the oldest the
kustomizations are written for.
"""
import os
import subprocess

import yaml

K8S_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy", "k8s")
OVERLAYS = ("sidecar", "gpu", "gpu-dra", "node-daemon", "sglang-engine", "vllm-engine")


def render(path):
    """The resources `kubectl kustomize` renders for deploy/k8s/<path>, as dicts."""
    result = subprocess.run([os.environ.get("KUBECTL", "kubectl"), "kustomize",
                             os.path.join(K8S_DIR, path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=False)
    if result.returncode != 0:
        raise AssertionError(f"kubectl kustomize {path} failed: {result.stderr}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc is not None]


def render_overlay(name):
    return render(os.path.join("overlays", name))


def find(resources, kind, name=None):
    """The one resource of this kind (and name); fails when there is not exactly one."""
    found = [r for r in resources
             if r["kind"] == kind and (name is None or r["metadata"]["name"] == name)]
    if len(found) != 1:
        raise AssertionError(f"{len(found)} {kind} named {name} in the render")
    return found[0]


def daemon_containers(resources):
    """(pod spec, container) of every kvcache-manager container in the render's workloads."""
    found = []
    for resource in resources:
        if resource["kind"] not in ("Deployment", "DaemonSet"):
            continue
        pod = resource["spec"]["template"]["spec"]
        for container in pod.get("initContainers", []) + pod.get("containers", []):
            if container.get("command", [None])[0] == "kvcache-manager":
                found.append((pod, container))
    return found


def flags(container):
    """The container's --name=value arguments as a dict."""
    result = {}
    for arg in container.get("args", []):
        assert arg.startswith("--") and "=" in arg, f"argument {arg!r} is not --name=value"
        name, value = arg[2:].split("=", 1)
        result[name] = value
    return result
