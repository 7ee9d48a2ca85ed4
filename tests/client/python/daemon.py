"""Test helpers: a kvcache-manager process, kvcache-test-client runs, the import path.

Needs KVCACHE_BIN_DIR (kvcache-manager, kvcache-test-client). Every wait is bounded, with bounds
generous enough for a loaded machine; nothing here depends on timing to pass.
"""

import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

SOURCE_DIR = os.environ.get("KVCACHE_SOURCE_DIR",
                            os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(SOURCE_DIR, "client", "python"))

import grpc  # noqa: E402

from kvcache_client import Client, KvCacheError  # noqa: E402

BIN_DIR = os.environ.get("KVCACHE_BIN_DIR", "")
BOUND = 30.0  # seconds: the longest any single wait may take
POOL_BLOCKS = 64  # the test daemons' pool: the default layout (32 KiB blocks of 16 tokens)


def binary(name: str) -> str:
    return os.path.join(BIN_DIR, name)


class Daemon:
    """kvcache-manager listening on `listen` (default: a Unix socket in a temp dir)."""

    def __init__(self, *extra: str, directory: Optional[str] = None,
                 listen: Optional[str] = None, pool: str = f"default:blocks={POOL_BLOCKS}"
                 ) -> None:
        self._temp = None if directory else tempfile.TemporaryDirectory(prefix="kvpy-")
        self.directory = directory or self._temp.name
        self.target = listen or "unix://" + os.path.join(self.directory, "kv.sock")
        starts = len([name for name in os.listdir(self.directory) if name.startswith("daemon")])
        self.log_path = os.path.join(self.directory, f"daemon-{starts}.log")  # one per start
        self._log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [binary("kvcache-manager"), "--listen", self.target,
             "--pool", pool, *extra],
            stdout=self._log, stderr=subprocess.STDOUT)
        # The address it serves (a TCP port 0 becomes a real one) and its epoch, from its log.
        deadline = time.monotonic() + BOUND
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"kvcache-manager exited with {self.process.returncode}: "
                                   f"{open(self.log_path).read()}")
            with open(self.log_path) as log:
                found = re.search(r"listening on (\S+), epoch (\d+)", log.read())
            if found:
                self.address, self.epoch = found.group(1), int(found.group(2))
                return
            time.sleep(0.05)
        raise RuntimeError(f"kvcache-manager did not start within {BOUND}s")

    def stop(self) -> None:
        """SIGTERM and wait: the daemon removes its socket, so a new one may take the path."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=BOUND)
        self._log.close()

    def cleanup(self) -> None:
        self.stop()
        if self._temp is not None:
            self._temp.cleanup()

    def client(self, **options) -> Client:
        options.setdefault("connect_timeout", BOUND)
        options.setdefault("rpc_timeout", BOUND)
        return Client(self.target, **options)


def run_test_client(target: str, action: str, first_token: int, num_tokens: int,
                    *extra: str) -> Dict[str, str]:
    """kvcache-test-client's result line as a dict; it must exit 0."""
    done = subprocess.run([binary("kvcache-test-client"), target, action, "default",
                           str(num_tokens), str(first_token), *extra],
                          capture_output=True, text=True, timeout=BOUND)
    if done.returncode != 0:
        raise AssertionError(f"kvcache-test-client {action}: exit {done.returncode}: "
                             f"{done.stderr}")
    for line in done.stdout.splitlines():
        if line.startswith("result "):
            return dict(field.split("=", 1) for field in line.split()[1:])
    raise AssertionError(f"no result line in {done.stdout!r}")


def tokens(first: int, count: int) -> List[int]:
    return list(range(first, first + count))


def wait_until(predicate, what: str) -> None:
    """Polls `predicate` until true; fails after BOUND seconds naming `what`."""
    deadline = time.monotonic() + BOUND
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def error_code(call, *args, **kwargs) -> grpc.StatusCode:
    """The code of the KvCacheError that call(*args, **kwargs) raises (AssertionError if none)."""
    try:
        call(*args, **kwargs)
    except KvCacheError as error:
        return error.code
    raise AssertionError(f"{getattr(call, '__name__', call)} raised no KvCacheError")


def error_message(call, *args, **kwargs) -> str:
    """The message of the KvCacheError that call(*args, **kwargs) raises (AssertionError if
    none)."""
    try:
        call(*args, **kwargs)
    except KvCacheError as error:
        return error.message
    raise AssertionError(f"{getattr(call, '__name__', call)} raised no KvCacheError")


class RedisCluster:
    """A Redis Cluster of `masters` redis-server processes on loopback ports, made as
    tests/testing/redis_cluster_process.cc makes it (no replicas, partial coverage allowed, no
    persistence). `target` is the daemon's --cluster_tier value. Raises RuntimeError when
    redis-server or redis-cli is missing or the cluster does not form within BOUND."""

    SERVER, CLI = "/usr/bin/redis-server", "/usr/bin/redis-cli"

    def __init__(self, masters: int = 3) -> None:
        if not (os.access(self.SERVER, os.X_OK) and os.access(self.CLI, os.X_OK)):
            raise RuntimeError("redis-server and redis-cli are needed for a Redis Cluster")
        self._temp = tempfile.TemporaryDirectory(prefix="kvredis-")
        self.ports: List[int] = []
        self.processes: List[subprocess.Popen] = []
        try:
            for _ in range(masters):
                self._start_node(_free_port(self.ports))
            addresses = [f"127.0.0.1:{port}" for port in self.ports]
            subprocess.run([self.CLI, "--cluster", "create", *addresses, "--cluster-replicas",
                            "0", "--cluster-yes"], check=True, capture_output=True,
                           timeout=BOUND)
            wait_until(lambda: all("cluster_state:ok" in self._cli(port, "CLUSTER", "INFO")
                                   for port in self.ports), "the Redis Cluster to form")
        except BaseException:
            self.stop()
            raise
        self.target = "redis://" + ",".join(addresses)

    def _start_node(self, port: int) -> None:
        directory = self._temp.name
        self.ports.append(port)
        self.processes.append(subprocess.Popen(
            [self.SERVER, "--port", str(port), "--bind", "127.0.0.1", "--dir", directory,
             "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
             "--cluster-node-timeout", "2000", "--cluster-require-full-coverage", "no",
             "--save", "", "--appendonly", "no",
             "--logfile", os.path.join(directory, f"redis-{port}.log")]))
        wait_until(lambda: self._cli(port, "PING").startswith("PONG"),
                   f"redis-server on port {port}")

    def _cli(self, port: int, *command: str) -> str:
        done = subprocess.run([self.CLI, "-p", str(port), *command], capture_output=True,
                              text=True, timeout=BOUND)
        return done.stdout if done.returncode == 0 else ""

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
                process.wait(timeout=BOUND)
        self._temp.cleanup()


def _free_port(taken: List[int]) -> int:
    """A loopback port free now whose cluster bus port (+10000) is free too."""
    for _ in range(200):
        port = random.randint(20000, 55000)
        if port in taken:
            continue
        try:
            for candidate in (port, port + 10000):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair for redis-server")
