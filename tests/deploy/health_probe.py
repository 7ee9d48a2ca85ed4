#!/usr/bin/env python3
"""health_probe.py ADDRESS [SERVICE] [TIMEOUT_S]: what kubelet's grpc probe does, retried until
SERVING or the timeout: grpc.health.v1.Health/Check over plaintext to ADDRESS. Exit 0 when
SERVING. PYTHONPATH holds the generated health stubs."""
import sys
import time

import grpc
import health_pb2
import health_pb2_grpc


def wait_serving(address, service="", timeout_s=30.0):
    """Returns the last status name (SERVING on success) or the last RPC error."""
    deadline = time.time() + timeout_s
    last = "no answer"
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.time() < deadline:
            try:
                status = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=1).status
                last = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
                if last == "SERVING":
                    return last
            except grpc.RpcError as error:
                last = f"{error.code().name}: {error.details()}"
            time.sleep(0.2)
    return last


if __name__ == "__main__":
    result = wait_serving(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "",
                          float(sys.argv[3]) if len(sys.argv) > 3 else 30.0)
    print(f"health {sys.argv[1]}: {result}")
    sys.exit(0 if result == "SERVING" else 1)
