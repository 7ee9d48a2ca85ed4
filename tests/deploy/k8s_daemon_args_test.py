#!/usr/bin/env python3
"""Starts kvcache-manager with exactly the command and arguments the rendered manifests give it
and probes it as kubelet would: grpc.health.v1 Check on the health port, with each probe's
service. Then what the pod's neighbours do: the worker dials the socket the worker container is
given; for the node daemon also a remote client over mutual TLS on the Service's port (and one
without a certificate is refused), the socket open to other uids, /metrics on its port, and the
drain: readiness NOT_SERVING after SIGTERM, then a clean exit.

Only the mounted paths move (each volume becomes a temporary directory holding what the volume
would, laid out as kubelet lays it out: a Secret's keys as symlinks into a `..data` directory, with
the volume's defaultMode, root's, the group the pod's fsGroup when it has one; the Secrets' files
are made here with openssl). The pod's init containers run first (with the paths moved), then the
daemon as the uid, gid and supplementary groups (fsGroup) its securityContext gives it, and the
worker's calls as the worker container's. Ports stay as written: run it as root in a network
namespace of its own (CMake: `unshare -n`), where it brings loopback up. As another user it
skips: only root can take on the pod's uids.
Env: KVCACHE_BIN_DIR, PYTHONPATH with the health stubs, KUBECTL.
"""
import fcntl
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

import grpc
import health_pb2
import health_pb2_grpc

from health_probe import wait_serving
from k8s_render import daemon_containers, render_overlay

BIN_DIR = os.environ["KVCACHE_BIN_DIR"]
PING = "/kvcache.v1.KvCache/Ping"


def bring_loopback_up():
    SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(s, SIOCGIFFLAGS, request + b"\0" * 14)[:18])[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | IFF_UP) + b"\0" * 14)


def ping(channel):
    return channel.unary_unary(PING, request_serializer=bytes,
                               response_deserializer=bytes)(b"", timeout=5)


def make_pki(directory):
    """The kvcache-tls Secret's keys (tls.crt, tls.key, ca.crt) and a client certificate."""
    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)
    new_key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    openssl("req", "-x509", *new_key, "-keyout", "ca.key", "-out", "ca.crt", "-days", "1",
            "-subj", "/CN=kvcache test CA")
    for name, names in (("tls", "DNS:kvcache,IP:127.0.0.1"), ("client", "DNS:client")):
        with open(os.path.join(directory, f"{name}.ext"), "w") as f:
            f.write(f"subjectAltName={names}\n")
        openssl("req", *new_key, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN={name}")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "1", "-out", f"{name}.crt", "-extfile", f"{name}.ext")


def run_as(security, pod_security):
    """setpriv arguments that take on a container's uid, gid and supplementary groups, as the
    runtime does: runAsUser/runAsGroup (the container's, else the pod's), the pod's fsGroup and
    supplementalGroups."""
    def field(name):
        return security.get(name, pod_security.get(name))
    uid, gid = field("runAsUser"), field("runAsGroup")
    assert uid is not None, "the test takes the uid from runAsUser"
    groups = [g for g in [pod_security.get("fsGroup")] + pod_security.get("supplementalGroups", [])
              if g is not None]
    return ["setpriv", f"--reuid={uid}", f"--regid={gid if gid is not None else 0}",
            f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups"]


def set_fs_group(path, fs_group, read_only):
    """What kubelet's SetVolumeOwnership does to every file of a volume under a pod fsGroup:
    group fsGroup, group-readable (and writable unless the volume is read-only), directories
    setgid and group-traversable. This is what overrides a Secret's defaultMode 0400."""
    mask = 0o440 if read_only else 0o660
    for root, dirs, files in os.walk(path):
        for name in [root] + [os.path.join(root, f) for f in dirs + files]:
            info = os.lstat(name)
            if os.path.islink(name):
                continue
            os.lchown(name, -1, fs_group)
            extra = mask | 0o2110 if os.path.isdir(name) else mask
            os.chmod(name, (info.st_mode & 0o7777) | extra)


def lay_out_secret(directory, files, default_mode, fs_group):
    """A Secret volume as kubelet's atomic writer makes it: the files in a timestamped directory,
    `..data` a symlink to it, each key a symlink through `..data`; all root's, mode defaultMode."""
    os.chmod(directory, 0o1777)
    data = os.path.join(directory, "..2026_01_01_00_00_00.000000000")
    os.mkdir(data, 0o755)
    for name, content in files.items():
        path = os.path.join(data, name)
        with open(path, "wb") as f:
            f.write(content)
        os.chmod(path, default_mode)
        os.symlink(os.path.join("..data", name), os.path.join(directory, name))
    os.symlink(os.path.basename(data), os.path.join(directory, "..data"))
    if fs_group is not None:
        set_fs_group(directory, fs_group, read_only=True)


class DaemonFromManifest:
    """kvcache-manager as a rendered overlay runs it, each volume a temporary directory."""

    def __init__(self, overlay):
        resources = render_overlay(overlay)
        (self.pod, self.container), = daemon_containers(resources)
        self.workers = [c for r in resources if r["kind"] == "Deployment"
                        for c in r["spec"]["template"]["spec"]["containers"]]
        self.worker_pod = next(r["spec"]["template"]["spec"] for r in resources
                               if r["kind"] == "Deployment")
        self.pod_security = self.pod.get("securityContext", {})
        self.dir = tempfile.TemporaryDirectory()
        os.chmod(self.dir.name, 0o755)  # the daemon's uid reaches the volumes below
        self.volumes = {}
        for volume in self.pod.get("volumes", []):
            host = os.path.join(self.dir.name, volume["name"])
            os.makedirs(host)
            self.volumes[volume["name"]] = host
            if "emptyDir" in volume:
                os.chmod(host, 0o777)
                if self.pod_security.get("fsGroup") is not None:
                    set_fs_group(host, self.pod_security["fsGroup"], read_only=False)
        self.mounts = {}
        for mount in self.container.get("volumeMounts", []):
            if mount["mountPath"] == "/dev/shm":
                continue  # shm_open always uses /dev/shm
            self.mounts[mount["mountPath"]] = self.volumes[mount["name"]]
        self.command = [self.moved(arg) for arg in self.container["command"] +
                        self.container["args"]]
        self.command[0] = os.path.join(BIN_DIR, self.command[0])
        self.process = None

    def moved(self, text):
        for mount_path, host in self.mounts.items():
            text = re.sub(re.escape(mount_path.rstrip("/")) + r"(?=/|\s|$)", host, text)
        return text

    def flag(self, name):
        prefix = f"--{name}="
        return next(a[len(prefix):] for a in self.command if a.startswith(prefix))

    def volume_directory(self, name):
        return self.volumes[name]

    def secret(self, name, files):
        """Lays out the Secret volume `name` with these files as kubelet would."""
        volume = next(v for v in self.pod["volumes"] if v["name"] == name)
        lay_out_secret(self.volumes[name], files, volume["secret"].get("defaultMode", 0o644),
                       self.pod_security.get("fsGroup"))

    def run_init_containers(self):
        """The pod's init containers that run to completion, as their uids, paths moved."""
        for init in self.pod.get("initContainers", []):
            if init.get("restartPolicy") == "Always":
                continue  # a native sidecar: the daemon itself
            command = [self.moved(arg) for arg in init["command"] + init.get("args", [])]
            subprocess.run(run_as(init.get("securityContext", {}), self.pod_security) + command,
                           check=True)

    def start(self):
        self.run_init_containers()
        self.log = open(os.path.join(self.dir.name, "daemon.log"), "w+")
        self.process = subprocess.Popen(
            run_as(self.container.get("securityContext", {}), self.pod_security) + self.command,
            stdout=self.log, stderr=subprocess.STDOUT)

    def as_worker(self, target):
        """Pings `target` from a process with the worker container's uid and groups."""
        worker, = self.workers
        prefix = run_as(worker.get("securityContext", {}),
                        self.worker_pod.get("securityContext", {}))
        script = ("import sys, grpc\n"
                  "with grpc.insecure_channel(sys.argv[1]) as channel:\n"
                  f"    channel.unary_unary({PING!r}, request_serializer=bytes,\n"
                  "        response_deserializer=bytes)(b'', timeout=5)\n")
        return subprocess.run(prefix + [sys.executable, "-c", script, target],
                              capture_output=True, text=True, check=False)

    def output(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def stop(self):
        if self.process is not None:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            self.log.close()
        self.dir.cleanup()


class DaemonArgsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            raise unittest.SkipTest("runs the daemon as the pod's uids: needs root")
        bring_loopback_up()

    def start(self, overlay):
        daemon = DaemonFromManifest(overlay)
        self.addCleanup(daemon.stop)
        return daemon

    def probe_like_kubelet(self, daemon):
        """Each probe in the manifest, on 127.0.0.1 (the pod IP in this namespace)."""
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            spec = daemon.container[probe]["grpc"]
            status = wait_serving(f"127.0.0.1:{spec['port']}", spec.get("service", ""), 30)
            self.assertEqual(status, "SERVING", f"{probe}:\n{daemon.output()}")

    def worker_target(self, daemon):
        worker, = daemon.workers
        target, = [a for a in worker["args"] if a.startswith("--target=")]
        return daemon.moved(target[len("--target="):])

    def test_sidecar(self):
        daemon = self.start("sidecar")
        daemon.start()
        self.probe_like_kubelet(daemon)
        self.check_worker(daemon)
        self.check_metrics(daemon)
        self.check_drain(daemon)

    def check_worker(self, daemon):
        result = daemon.as_worker(self.worker_target(daemon))
        self.assertEqual(result.returncode, 0, result.stderr + daemon.output())

    def test_node_daemon(self):
        daemon = self.start("node-daemon")
        tls = os.path.join(daemon.dir.name, "pki")
        os.mkdir(tls)
        make_pki(tls)

        def read(name):
            with open(os.path.join(tls, name), "rb") as f:
                return f.read()
        daemon.secret("tls", {name: read(name) for name in ("tls.crt", "tls.key", "ca.crt")})
        # The pods on the node by uid (the worker pod's), remote clients by certificate subject.
        worker_uid = self.worker_uid(daemon)
        daemon.secret("identities", {"identities": (
            f"tenant default\nuid {worker_uid} default worker\n"
            "subject client default reader\n").encode()})
        daemon.start()
        self.probe_like_kubelet(daemon)
        socket_path = daemon.flag("listen")[len("unix://"):]
        self.assertEqual(os.stat(socket_path).st_mode & 0o777, int(daemon.flag("socket_mode"), 8))
        self.check_worker(daemon)
        # A client on another node: mutual TLS on the port the Service targets.
        address = "127.0.0.1:" + daemon.flag("tcp_listen").rsplit(":", 1)[1]
        self.assertIn(f"also on TCP {daemon.flag('tcp_listen')}", daemon.output())
        credentials = grpc.ssl_channel_credentials(read("ca.crt"), read("client.key"),
                                                   read("client.crt"))
        with grpc.secure_channel(address, credentials) as channel:
            self.assertIsInstance(ping(channel), bytes)
        anonymous = grpc.ssl_channel_credentials(read("ca.crt"))
        with grpc.secure_channel(address, anonymous) as channel:
            with self.assertRaises(grpc.RpcError) as refused:
                ping(channel)
            self.assertEqual(refused.exception.code(), grpc.StatusCode.UNAVAILABLE)
        self.check_metrics(daemon)
        self.check_drain(daemon)

    def worker_uid(self, daemon):
        worker, = daemon.workers
        return worker.get("securityContext", {}).get(
            "runAsUser", daemon.worker_pod.get("securityContext", {}).get("runAsUser"))

    def check_metrics(self, daemon):
        port = daemon.flag("metrics_listen").rsplit(":", 1)[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            self.assertIn("kvcache_blocks_capacity", response.read().decode())

    def check_drain(self, daemon):
        readiness = daemon.container["readinessProbe"]["grpc"]
        daemon.process.send_signal(signal.SIGTERM)
        address = f"127.0.0.1:{readiness['port']}"
        status = None
        deadline = time.time() + 3
        with grpc.insecure_channel(address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.time() < deadline and status != health_pb2.HealthCheckResponse.NOT_SERVING:
                status = stub.Check(health_pb2.HealthCheckRequest(service=readiness["service"]),
                                    timeout=2).status
                time.sleep(0.05)
            self.assertEqual(status, health_pb2.HealthCheckResponse.NOT_SERVING)
        self.assertEqual(daemon.process.wait(timeout=30), 0, daemon.output())


if __name__ == "__main__":
    unittest.main(verbosity=2)
