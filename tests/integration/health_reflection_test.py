#!/usr/bin/env python3
"""grpc.health.v1 and server reflection on a real kvcache-manager, as kubelet and grpcurl-like
tools see them: SERVING on the Unix socket and on the health-only TCP port; that port serves
nothing else; reflection on the main address lists kvcache.v1.KvCache; NOT_SERVING on both
during the SIGTERM drain, then a clean exit.

Stubs come from Debian's grpc-proto (generated at build time, see CMakeLists.txt), the client
library is Debian's python3-grpcio. Env: KVCACHE_BIN_DIR, PYTHONPATH with the stubs.
"""
import os
import re
import signal
import subprocess
import tempfile
import time
import unittest

import grpc
import health_pb2
import health_pb2_grpc
import reflection_pb2
import reflection_pb2_grpc

BIN_DIR = os.environ["KVCACHE_BIN_DIR"]
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def check(channel, service=""):
    stub = health_pb2_grpc.HealthStub(channel)
    return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


def list_services(channel):
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    replies = stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5)
    return sorted(s.name for reply in replies for s in reply.list_services_response.service)


class HealthReflectionTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.socket = os.path.join(self.dir.name, "kv.sock")
        self.daemon = subprocess.Popen(
            [os.path.join(BIN_DIR, "kvcache-manager"), "--listen=unix://" + self.socket,
             "--health_listen=127.0.0.1:0", "--drain_period=3s"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.health_address = None
        deadline = time.time() + 30
        while time.time() < deadline:
            line = self.daemon.stdout.readline()
            self.assertTrue(line, "kvcache-manager exited before serving")
            match = re.search(r"health on (\S+) ", line)
            if match:
                self.health_address = match.group(1)
            if line.startswith("  pool "):
                break
        self.assertIsNotNone(self.health_address, "no 'health on' line")
        self.unix = grpc.insecure_channel("unix:" + self.socket)
        self.tcp = grpc.insecure_channel(self.health_address)

    def tearDown(self):
        self.unix.close()
        self.tcp.close()
        if self.daemon.poll() is None:
            self.daemon.kill()
            self.daemon.wait()
        self.dir.cleanup()

    def test_serving_on_both_then_not_serving_during_drain(self):
        for channel in (self.unix, self.tcp):
            self.assertEqual(check(channel), SERVING)
            self.assertEqual(check(channel, "kvcache.v1.KvCache"), SERVING)
            with self.assertRaises(grpc.RpcError) as unknown:
                check(channel, "no.such.Service")
            self.assertEqual(unknown.exception.code(), grpc.StatusCode.NOT_FOUND)

        self.daemon.send_signal(signal.SIGTERM)
        # The drain lasts 3 s: both addresses report NOT_SERVING while still answering.
        deadline = time.time() + 2
        statuses = None
        while time.time() < deadline:
            statuses = [check(self.tcp), check(self.tcp, "kvcache.v1.KvCache"),
                        check(self.unix), check(self.unix, "kvcache.v1.KvCache")]
            if statuses == [NOT_SERVING] * 4:
                break
            time.sleep(0.05)
        self.assertEqual(statuses, [NOT_SERVING] * 4)
        self.assertEqual(self.daemon.wait(timeout=30), 0)
        self.assertFalse(os.path.exists(self.socket), "the socket was not removed")

    def test_reflection_lists_the_api_on_the_main_address_only(self):
        services = list_services(self.unix)
        self.assertIn("kvcache.v1.KvCache", services)
        self.assertIn("grpc.health.v1.Health", services)
        self.assertIn("grpc.reflection.v1alpha.ServerReflection", services)

    def test_the_health_port_serves_nothing_else(self):
        with self.assertRaises(grpc.RpcError) as reflection:
            list_services(self.tcp)
        self.assertEqual(reflection.exception.code(), grpc.StatusCode.UNIMPLEMENTED)
        ping = self.tcp.unary_unary("/kvcache.v1.KvCache/Ping",
                                    request_serializer=lambda request: request,
                                    response_deserializer=lambda response: response)
        with self.assertRaises(grpc.RpcError) as call:
            ping(b"", timeout=5)
        self.assertEqual(call.exception.code(), grpc.StatusCode.UNIMPLEMENTED)
        # The main address answers the same call.
        main_ping = self.unix.unary_unary("/kvcache.v1.KvCache/Ping",
                                          request_serializer=lambda request: request,
                                          response_deserializer=lambda response: response)
        self.assertIsInstance(main_ping(b"", timeout=5), bytes)


if __name__ == "__main__":
    unittest.main(verbosity=2)
