#!/usr/bin/env python3
"""Renders every deploy/k8s overlay with `kubectl kustomize` and checks what the manifests promise:
the native sidecar (restartPolicy: Always, startup probe), the socket on a shared emptyDir at
/run/kvcache, /dev/shm as a sized Memory emptyDir, gRPC probes on the health port, requests and
limits, non-root / read-only root / no privilege escalation / no capabilities, annotated metrics
port that a Service targets by number (not 9400, dcgm-exporter's), the optional ServiceMonitor, a
NetworkPolicy that admits only the daemon's ports, PodDisruptionBudget, the app.kubernetes.io
labels and a versioned image; the GPU in exactly one container with a shared PID namespace; the
node daemon's DaemonSet with a host-path socket, hostIPC, mutual TLS Service, certificate and
identity file from Secrets that its uid can read, its TLS Service headless; no pod mounts a service
account token.

Env: KUBECTL (default kubectl). Needs Debian's python3-yaml.
"""
import importlib
import json
import os
import re
import sys
import tempfile
import unittest

from k8s_render import K8S_DIR, OVERLAYS, daemon_containers, find, flags, render, render_overlay

# The project's version (client/python/pyproject.toml): the image tag and the version label.
VERSION = "0.1.0"
IMAGE = f"kvcache:{VERSION}"
# The engines' own images (not built here), by overlay/container; every other container is ours.
# vllm-engine's is vllm/vllm-openai with the Python client installed
# (deploy/docker/vllm-engine.Dockerfile).
ENGINE_IMAGES = {
    "sglang-engine/sglang": "lmsysorg/sglang:v0.5.6",
    "vllm-engine/worker": f"vllm-kvcache:0.29.0-kvcache{VERSION}",
}
LABELS = ("name", "instance", "component", "version", "part-of", "managed-by")
# dcgm-exporter's default metrics port, on the same GPU nodes.
DCGM_EXPORTER_PORT = 9400
# The daemon's own memory beside its pools and tiers, as its containers' limits budget it
# (docs/benchmarks.md, "Pool pre-faulting": ~5 MiB idle, ~30 MiB anonymous with a 4 GiB pool).
DAEMON_OVERHEAD_BYTES = 100 << 20
UNITS = {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "KiB": 1 << 10, "MiB": 1 << 20,
         "GiB": 1 << 30}


def to_bytes(quantity):
    number, unit = re.fullmatch(r"(\d+)([KMG]iB?)?", str(quantity)).groups()
    return int(number) * UNITS[unit or ""]


def port_of(address):
    return int(address.rsplit(":", 1)[1])


def all_containers(pod):
    return pod.get("initContainers", []) + pod["containers"]


def mount_of(container, path):
    """The volume name mounted at the directory holding `path` in this container."""
    for mount in container.get("volumeMounts", []):
        if path == mount["mountPath"] or path.startswith(mount["mountPath"].rstrip("/") + "/"):
            return mount["name"]
    raise AssertionError(f"{container['name']}: nothing mounted where {path} is")


def volume(pod, name):
    return next(v for v in pod["volumes"] if v["name"] == name)


def selects(selector, labels):
    return all(labels.get(key) == value for key, value in selector.items())


def expected_image(overlay, container):
    """The image a container must run: the project's, but an engine overlay's engine."""
    return ENGINE_IMAGES.get(f"{overlay}/{container['name']}", IMAGE)


def workloads(resources):
    return [r for r in resources if r["kind"] in ("Deployment", "DaemonSet")]


def dialled(app):
    """The daemon address the worker dials: its --target, or vLLM's kvcache tier's target in
    --kv-transfer-config."""
    args = app["args"]
    if "--kv-transfer-config" in args:
        tiers = kv_transfer_config(app)["kv_connector_extra_config"]["secondary_tiers"]
        return next(tier["target"] for tier in tiers
                    if tier.get("module_path") == "kvcache_client.vllm")
    return next(arg[len("--target="):] for arg in args if arg.startswith("--target="))


def kv_transfer_config(app):
    args = app["args"]
    return json.loads(args[args.index("--kv-transfer-config") + 1])


class ManifestsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.renders = {name: render_overlay(name) for name in OVERLAYS}

    def test_the_image_is_labelled_with_the_projects_version(self):
        """The image's OCI version label, the manifests' image tag and version label, and
        CMakeLists.txt's project version are one version."""
        root = os.path.join(K8S_DIR, "..", "..")
        with open(os.path.join(root, "CMakeLists.txt")) as cmake:
            self.assertIn(f"project(kvcache VERSION {VERSION} ", cmake.read())
        with open(os.path.join(root, "deploy", "docker", "Dockerfile")) as dockerfile:
            labels = dict(re.findall(r'(org\.opencontainers\.image\.[a-z.]+)="([^"]*)"',
                                     dockerfile.read()))
        self.assertEqual(labels["org.opencontainers.image.version"], VERSION)
        self.assertEqual(labels["org.opencontainers.image.licenses"], "Apache-2.0")

    def test_the_default_is_the_sidecar(self):
        self.assertEqual(sorted(map(repr, render("."))),
                         sorted(map(repr, self.renders["sidecar"])))

    def test_every_container_is_locked_down_and_sized(self):
        for overlay, resources in self.renders.items():
            for workload in workloads(resources):
                pod = workload["spec"]["template"]["spec"]
                self.assertEqual(pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault")
                # No pod calls the Kubernetes API: no service account token mounted in it.
                self.assertIs(pod.get("automountServiceAccountToken"), False,
                              f"{overlay}/{workload['metadata']['name']}")
                for container in all_containers(pod):
                    where = f"{overlay}/{workload['metadata']['name']}/{container['name']}"
                    with self.subTest(where):
                        self.assertEqual(container["image"], expected_image(overlay, container))
                        for kind in ("requests", "limits"):
                            self.assertIn("cpu", container["resources"][kind])
                            self.assertIn("memory", container["resources"][kind])
                        security = container["securityContext"]
                        self.assertIs(security["allowPrivilegeEscalation"], False)
                        self.assertIs(security["readOnlyRootFilesystem"], True)
                        self.assertEqual(security["capabilities"]["drop"], ["ALL"])
                        if container["name"] == "socket-dir":
                            # The one root step: chown of the node daemon's host-path directory.
                            self.assertEqual(overlay, "node-daemon")
                            self.assertEqual(security["capabilities"]["add"], ["CHOWN", "FOWNER"])
                            self.assertIs(security["runAsNonRoot"], False)
                        else:
                            self.assertNotIn("add", security["capabilities"])
                            self.assertIs(security["runAsNonRoot"], True)
                            self.assertNotEqual(
                                security.get("runAsUser", pod["securityContext"]["runAsUser"]), 0)

    def test_the_daemon_is_probed_over_grpc_and_exposes_named_ports(self):
        for overlay, resources in self.renders.items():
            daemons = daemon_containers(resources)
            self.assertEqual(len(daemons), 1, overlay)
            pod, daemon = daemons[0]
            args = flags(daemon)
            ports = {p["name"]: p["containerPort"] for p in daemon["ports"]}
            with self.subTest(overlay):
                self.assertEqual(ports["health"], port_of(args["health_listen"]))
                self.assertEqual(ports["metrics"], port_of(args["metrics_listen"]))
                self.assertTrue(args["health_listen"].startswith("0.0.0.0:"))  # kubelet: pod IP
                self.assertTrue(args["metrics_listen"].startswith("0.0.0.0:"))
                for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                    self.assertEqual(daemon[probe]["grpc"]["port"], ports["health"], probe)
                self.assertEqual(daemon["readinessProbe"]["grpc"]["service"], "kvcache.v1.KvCache")
                self.assertNotIn("service", daemon["livenessProbe"]["grpc"])
                workload = next(w for w in workloads(resources)
                                if w["spec"]["template"]["spec"] is pod)
                template = workload["spec"]["template"]["metadata"]
                self.assertEqual(template["annotations"]["prometheus.io/scrape"], "true")
                self.assertEqual(template["annotations"]["prometheus.io/port"],
                                 str(ports["metrics"]))
                # Metrics Service -> the daemon's pods by port number: a named port of a native
                # sidecar resolves only from Kubernetes 1.32 (kubernetes#127958).
                service = find(resources, "Service", "kvcache-metrics")
                self.assertTrue(selects(service["spec"]["selector"], template["labels"]))
                self.assertEqual([p["targetPort"] for p in service["spec"]["ports"]],
                                 [ports["metrics"]])
                self.assertNotEqual(ports["metrics"], DCGM_EXPORTER_PORT)
                # The pool (pre-faulted, so charged to the daemon) and the daemon's own memory fit
                # in its memory limit.
                pool_bytes = to_bytes(re.search(r"bytes=(\w+)", args["pool"]).group(1))
                self.assertLessEqual(pool_bytes + DAEMON_OVERHEAD_BYTES,
                                     to_bytes(daemon["resources"]["limits"]["memory"]))

    def test_every_port_is_a_number_and_none_is_dcgm_exporters(self):
        for overlay, resources in self.renders.items():
            for resource in resources:
                where = f"{overlay}/{resource['kind']}/{resource['metadata']['name']}"
                with self.subTest(where):
                    if resource["kind"] == "Service":
                        for port in resource["spec"]["ports"]:
                            self.assertIsInstance(port["targetPort"], int)
                            self.assertNotEqual(port["port"], DCGM_EXPORTER_PORT)
                            self.assertNotEqual(port["targetPort"], DCGM_EXPORTER_PORT)
                    if resource["kind"] in ("Deployment", "DaemonSet"):
                        for container in all_containers(resource["spec"]["template"]["spec"]):
                            for port in container.get("ports", []):
                                self.assertNotEqual(port["containerPort"], DCGM_EXPORTER_PORT)
                            for arg in container.get("args", []):
                                self.assertNotRegex(arg, f":{DCGM_EXPORTER_PORT}$")

    def test_every_resource_has_the_recommended_labels(self):
        for overlay, resources in self.renders.items():
            for resource in resources:
                where = f"{overlay}/{resource['kind']}/{resource['metadata']['name']}"
                with self.subTest(where):
                    places = [resource["metadata"]]
                    if resource["kind"] in ("Deployment", "DaemonSet"):
                        places.append(resource["spec"]["template"]["metadata"])
                    for metadata in places:
                        labels = metadata.get("labels", {})
                        for label in LABELS:
                            self.assertIn(f"app.kubernetes.io/{label}", labels)
                        self.assertEqual(labels["app.kubernetes.io/part-of"], "kvcache")
                        self.assertEqual(labels["app.kubernetes.io/version"], VERSION)
                        self.assertEqual(labels["app.kubernetes.io/managed-by"], "kustomize")
                    if resource["kind"] in ("Deployment", "DaemonSet"):
                        # A selector is immutable: the version may not be in it.
                        self.assertNotIn("app.kubernetes.io/version",
                                         resource["spec"]["selector"]["matchLabels"])

    def test_images_carry_a_version(self):
        for overlay, resources in self.renders.items():
            for workload in workloads(resources):
                for container in all_containers(workload["spec"]["template"]["spec"]):
                    with self.subTest(f"{overlay}/{container['name']}"):
                        name, _, tag = container["image"].rpartition(":")
                        self.assertTrue(name and tag, container["image"])
                        self.assertNotEqual(tag, "latest")
                        self.assertEqual(container["image"], expected_image(overlay, container))

    def test_a_network_policy_admits_only_the_daemons_ports(self):
        for overlay, resources in self.renders.items():
            with self.subTest(overlay):
                policies = [r for r in resources if r["kind"] == "NetworkPolicy"
                            and r["metadata"]["name"] == "kvcache-manager"]
                self.assertEqual(len(policies), 1)
                policy = policies[0]
                self.assertEqual(policy["apiVersion"], "networking.k8s.io/v1")
                self.assertEqual(policy["spec"]["policyTypes"], ["Ingress"])
                pod, daemon = daemon_containers(resources)[0]
                workload = next(w for w in workloads(resources)
                                if w["spec"]["template"]["spec"] is pod)
                self.assertTrue(selects(policy["spec"]["podSelector"]["matchLabels"],
                                        workload["spec"]["template"]["metadata"]["labels"]))
                admitted = set()
                for rule in policy["spec"]["ingress"]:
                    for port in rule["ports"]:
                        self.assertIsInstance(port["port"], int)
                        admitted.add(port["port"])
                    # Health and metrics have no authentication: never from outside the
                    # cluster (an empty namespaceSelector is every pod of the cluster).
                    plaintext = {port["port"] for port in rule["ports"]} & {
                        port_of(flags(daemon)["health_listen"]),
                        port_of(flags(daemon)["metrics_listen"])}
                    if plaintext:
                        self.assertTrue(rule.get("from"), rule)
                        for peer in rule["from"]:
                            self.assertNotIn("ipBlock", peer)
                self.assertEqual(admitted, {p["containerPort"] for p in daemon["ports"]})

    def test_the_service_monitor_is_optional(self):
        monitor_dir = os.path.join(K8S_DIR, "optional", "servicemonitor")
        for overlay, resources in self.renders.items():
            with self.subTest(overlay):
                # Not in the overlays: without the Prometheus Operator's CRD, applying one fails.
                self.assertEqual([r for r in resources if r["kind"] == "ServiceMonitor"], [])
                # Added next to an overlay, it scrapes the metrics Service.
                with tempfile.TemporaryDirectory() as directory:
                    with open(os.path.join(directory, "kustomization.yaml"), "w") as f:
                        f.write("bases:\n")
                        for base in (os.path.join(K8S_DIR, "overlays", overlay), monitor_dir):
                            f.write(f"- {os.path.relpath(base, directory)}\n")
                    with_monitor = render(directory)  # an absolute path stays one
                self.assertEqual(len(with_monitor), len(resources) + 1)
                monitor = find(with_monitor, "ServiceMonitor", "kvcache")
                self.assertEqual(monitor["apiVersion"], "monitoring.coreos.com/v1")
                service = find(with_monitor, "Service", "kvcache-metrics")
                self.assertTrue(selects(monitor["spec"]["selector"]["matchLabels"],
                                        service["metadata"]["labels"]))
                self.assertEqual([e["port"] for e in monitor["spec"]["endpoints"]],
                                 [p["name"] for p in service["spec"]["ports"]])

    def test_workers_have_a_disruption_budget(self):
        for overlay, resources in self.renders.items():
            pdb = find(resources, "PodDisruptionBudget")
            worker = find(resources, "Deployment", "kvcache-worker")
            with self.subTest(overlay):
                self.assertEqual(pdb["apiVersion"], "policy/v1")
                self.assertTrue(selects(pdb["spec"]["selector"]["matchLabels"],
                                        worker["spec"]["template"]["metadata"]["labels"]))
                self.assertIn("maxUnavailable", pdb["spec"])

    def check_sidecar_pod(self, resources):
        worker = find(resources, "Deployment", "kvcache-worker")
        pod = worker["spec"]["template"]["spec"]
        (daemon_pod, daemon), = daemon_containers(resources)
        self.assertIs(daemon_pod, pod)
        self.assertEqual(pod["initContainers"], [daemon])
        self.assertEqual(daemon["restartPolicy"], "Always")  # native sidecar
        self.assertIn("grpc", daemon["startupProbe"])
        app = next(c for c in pod["containers"] if c["name"] == "worker")
        # The socket on a shared emptyDir at /run/kvcache, and the worker dials it.
        socket = flags(daemon)["listen"]
        self.assertEqual(socket, "unix:///run/kvcache/kv.sock")
        self.assertEqual(dialled(app), socket)
        for container in (daemon, app):
            self.assertEqual(mount_of(container, "/run/kvcache/kv.sock"), "kvcache-socket")
            self.assertEqual(mount_of(container, "/dev/shm/x"), "dshm")
        self.assertEqual(volume(pod, "kvcache-socket")["emptyDir"], {})
        dshm = volume(pod, "dshm")["emptyDir"]
        self.assertEqual(dshm["medium"], "Memory")
        pool_bytes = to_bytes(re.search(r"bytes=(\w+)", flags(daemon)["pool"]).group(1))
        self.assertLessEqual(pool_bytes, to_bytes(dshm["sizeLimit"]))
        return pod, daemon, app

    def test_sidecar(self):
        pod, daemon, _ = self.check_sidecar_pod(self.renders["sidecar"])
        self.assertNotIn("device", flags(daemon))
        self.assertNotIn("shareProcessNamespace", pod)

    def test_gpu(self):
        pod, daemon, app = self.check_sidecar_pod(self.renders["gpu"])
        self.assertIs(pod["shareProcessNamespace"], True)
        self.assertEqual(flags(daemon)["device"], "cuda:0")
        gpus = [c["name"] for c in all_containers(pod)
                if "nvidia.com/gpu" in c["resources"].get("limits", {})]
        self.assertEqual(gpus, [app["name"]])
        self.assertEqual(app["resources"]["limits"]["nvidia.com/gpu"], 1)
        self.assertEqual(app["resources"]["requests"].get("nvidia.com/gpu", 1), 1)

    def test_gpu_dra(self):
        """The DRA variant: one claim per pod from the template, referenced by the daemon and the
        worker both (a device-plugin GPU reaches one container only), and no device-plugin GPU."""
        resources = self.renders["gpu-dra"]
        pod, daemon, app = self.check_sidecar_pod(resources)
        self.assertIs(pod["shareProcessNamespace"], True)
        self.assertEqual(flags(daemon)["device"], "cuda:0")
        claim, = pod["resourceClaims"]
        for container in (daemon, app):
            self.assertEqual(container["resources"]["claims"], [{"name": claim["name"]}],
                             container["name"])
        for container in all_containers(pod):
            for kind in ("requests", "limits"):
                self.assertNotIn("nvidia.com/gpu", container["resources"].get(kind, {}))
        template = find(resources, "ResourceClaimTemplate", claim["resourceClaimTemplateName"])
        self.assertEqual(template["apiVersion"], "resource.k8s.io/v1")
        request, = template["spec"]["spec"]["devices"]["requests"]
        self.assertEqual(request["exactly"]["deviceClassName"], "gpu.nvidia.com")
        self.assertEqual(request["exactly"].get("count", 1), 1)
        # Everything else is the gpu overlay's.
        self.assertEqual(flags(daemon), flags(daemon_containers(self.renders["gpu"])[0][1]))

    def test_vllm_engine(self):
        pod, daemon, app = self.check_sidecar_pod(self.renders["vllm-engine"])
        self.assertEqual(app["command"], ["vllm"])
        self.assertEqual(app["args"][0], "serve")
        config = kv_transfer_config(app)
        self.assertEqual((config["kv_connector"], config["kv_role"]),
                         ("OffloadingConnector", "kv_both"))
        extra = config["kv_connector_extra_config"]
        self.assertEqual(extra["spec_name"], "TieringOffloadingSpec")
        tier, = extra["secondary_tiers"]
        # vLLM's SecondaryTierFactory: getattr(import_module(module_path), type).
        sys.path.insert(0, os.path.join(K8S_DIR, "..", "..", "client", "python"))
        module = importlib.import_module(tier["module_path"])
        self.assertTrue(callable(getattr(module, tier["type"])))
        self.assertEqual(tier["pool"], re.match(r"(\w+):", flags(daemon)["pool"]).group(1))
        # The CPU primary tier lives in /dev/shm next to the pool, charged to the engine.
        pool_bytes = to_bytes(re.search(r"bytes=(\w+)", flags(daemon)["pool"]).group(1))
        self.assertLessEqual(pool_bytes + extra["cpu_bytes_to_use"],
                             to_bytes(volume(pod, "dshm")["emptyDir"]["sizeLimit"]))
        self.assertLessEqual(extra["cpu_bytes_to_use"],
                             to_bytes(app["resources"]["limits"]["memory"]))
        self.assertEqual(app["resources"]["limits"]["nvidia.com/gpu"], 1)
        # Its HTTP port is admitted by a policy of its own.
        http = find(self.renders["vllm-engine"], "NetworkPolicy", "vllm-engine-http")
        self.assertEqual([p["port"] for rule in http["spec"]["ingress"] for p in rule["ports"]],
                         [p["containerPort"] for p in app["ports"]])

    def test_node_daemon(self):
        resources = self.renders["node-daemon"]
        daemonset = find(resources, "DaemonSet", "kvcache-manager")
        pod = daemonset["spec"]["template"]["spec"]
        (daemon_pod, daemon), = daemon_containers(resources)
        self.assertIs(daemon_pod, pod)
        args = flags(daemon)
        self.assertIs(pod["hostIPC"], True)
        # The socket directory is the host's, shared with the worker pods on the node.
        socket = args["listen"]
        self.assertTrue(socket.startswith("unix:///"))
        socket_volume = volume(pod, mount_of(daemon, socket[len("unix://"):]))
        self.assertIn("hostPath", socket_volume)
        self.assertEqual(int(args["socket_mode"], 8) & 0o006, 0o006)
        # Certificates and the identity file come from Secrets.
        secrets = {}
        for flag in ("tls_cert", "tls_key", "tls_client_ca", "identities"):
            secrets[flag] = volume(pod, mount_of(daemon, args[flag]))["secret"]["secretName"]
        self.assertEqual(secrets, {"tls_cert": "kvcache-tls", "tls_key": "kvcache-tls",
                                   "tls_client_ca": "kvcache-tls",
                                   "identities": "kvcache-identities"})
        # The TLS Service reaches the daemon's TCP port.
        ports = {p["name"]: p["containerPort"] for p in daemon["ports"]}
        self.assertEqual(ports["grpc-tls"], port_of(args["tcp_listen"]))
        service = find(resources, "Service", "kvcache")
        # Headless: each node's daemon is its own cache, so no virtual IP spreads a client's
        # connections over them; the name resolves to every daemon.
        self.assertEqual(service["spec"].get("clusterIP"), "None")
        self.assertNotIn("type", service["spec"])
        self.assertTrue(selects(service["spec"]["selector"],
                                daemonset["spec"]["template"]["metadata"]["labels"]))
        self.assertEqual([p["targetPort"] for p in service["spec"]["ports"]], [ports["grpc-tls"]])
        # The workers: no sidecar, the node's socket and /dev/shm.
        worker_pod = find(resources, "Deployment", "kvcache-worker")["spec"]["template"]["spec"]
        self.assertNotIn("initContainers", worker_pod)
        self.assertIs(worker_pod["hostIPC"], True)
        app, = worker_pod["containers"]
        self.assertIn("--target=" + socket, app["args"])
        worker_socket = volume(worker_pod, mount_of(app, socket[len("unix://"):]))
        self.assertEqual(worker_socket["hostPath"]["path"], socket_volume["hostPath"]["path"])
        self.assertNotIn("dshm", [v["name"] for v in worker_pod["volumes"]])
        # The disk tier's file lives on the node (a hostPath), so a new daemon pod serves it
        # again; the pool and its host tier fit the memory limit.
        disk_path = re.search(r"disk_tier=([^:,]+):", args["pool"]).group(1)
        self.assertIn("hostPath", volume(pod, mount_of(daemon, disk_path)))
        pool_bytes = to_bytes(re.search(r"bytes=(\w+)", args["pool"]).group(1))
        host_tier_bytes = to_bytes(re.search(r"host_tier=(\w+)", args["pool"]).group(1))
        self.assertLessEqual(pool_bytes + host_tier_bytes + DAEMON_OVERHEAD_BYTES,
                             to_bytes(daemon["resources"]["limits"]["memory"]))


if __name__ == "__main__":
    unittest.main(verbosity=2)
