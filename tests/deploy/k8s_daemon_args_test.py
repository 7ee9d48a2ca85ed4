#!/usr/bin/env python3
"""Starts kvcache-manager with exactly the command and arguments the rendered manifests give it
and probes it as kubelet would: grpc.health.v1 Check on the health port, with each probe's
service. Then what the pod's neighbours do: the worker dials the socket the worker container is
given; for the node daemon also a remote client over mutual TLS on the Service's port (and one
without a certificate is refused), the socket open to other uids, /metrics on its port, and the
drain: readiness NOT_SERVING after SIGTERM, then a clean exit.

Only the mounted paths move (each volumeMount's mountPath becomes a temporary directory holding
what the volume would: the Secrets' files are made here with openssl). Ports stay as written:
run it in a network namespace of its own (CMake: `unshare -rn`), where it brings loopback up.
Env: KVCACHE_BIN_DIR, PYTHONPATH with the health stubs, KUBECTL.
"""
import fcntl
import os
import signal
import socket
import struct
import subprocess
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


class DaemonFromManifest:
    """kvcache-manager as a rendered overlay runs it, mounts moved under a temporary directory."""

    def __init__(self, overlay):
        resources = render_overlay(overlay)
        (self.pod, self.container), = daemon_containers(resources)
        self.workers = [c for r in resources if r["kind"] == "Deployment"
                        for c in r["spec"]["template"]["spec"]["containers"]]
        self.dir = tempfile.TemporaryDirectory()
        self.mounts = {}
        for mount in self.container.get("volumeMounts", []):
            if mount["mountPath"] == "/dev/shm":
                continue  # shm_open always uses /dev/shm
            host = os.path.join(self.dir.name, mount["name"])
            os.makedirs(host)
            self.mounts[mount["mountPath"]] = host
        self.command = [self.moved(arg) for arg in self.container["command"] +
                        self.container["args"]]
        self.command[0] = os.path.join(BIN_DIR, self.command[0])
        self.process = None

    def moved(self, text):
        for mount_path, host in self.mounts.items():
            text = text.replace(mount_path.rstrip("/") + "/", host + "/")
        return text

    def flag(self, name):
        prefix = f"--{name}="
        return next(a[len(prefix):] for a in self.command if a.startswith(prefix))

    def volume_directory(self, name):
        mount = next(m for m in self.container["volumeMounts"] if m["name"] == name)
        return self.mounts[mount["mountPath"]]

    def start(self):
        self.log = open(os.path.join(self.dir.name, "daemon.log"), "w+")
        self.process = subprocess.Popen(self.command, stdout=self.log, stderr=subprocess.STDOUT)

    def output(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.dir.cleanup()


class DaemonArgsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
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
        with grpc.insecure_channel(self.worker_target(daemon)) as channel:
            self.assertIsInstance(ping(channel), bytes)
        self.check_metrics(daemon)
        self.check_drain(daemon)

    def test_node_daemon(self):
        daemon = self.start("node-daemon")
        tls = daemon.volume_directory("tls")
        make_pki(tls)
        with open(os.path.join(daemon.volume_directory("identities"), "identities"), "w") as f:
            # The pods on the node by uid (this test runs as uid 0 of its user namespace), remote
            # clients by certificate subject.
            f.write("tenant default\nuid 0 default worker\nsubject client default reader\n")
        daemon.start()
        self.probe_like_kubelet(daemon)
        socket_path = daemon.flag("listen")[len("unix://"):]
        self.assertEqual(os.stat(socket_path).st_mode & 0o777, int(daemon.flag("socket_mode"), 8))
        with grpc.insecure_channel(self.worker_target(daemon)) as channel:
            self.assertIsInstance(ping(channel), bytes)
        # A client on another node: mutual TLS on the port the Service targets.
        address = "127.0.0.1:" + daemon.flag("tcp_listen").rsplit(":", 1)[1]
        self.assertIn(f"also on TCP {daemon.flag('tcp_listen')}", daemon.output())

        def read(name):
            with open(os.path.join(tls, name), "rb") as f:
                return f.read()
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
