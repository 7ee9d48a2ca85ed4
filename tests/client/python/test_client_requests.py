"""Requests as the client builds them, before any call: token ids checked without a Python loop
(lists by protobuf as it copies them, numpy arrays by one min/max) yet every bad token named
exactly; the element types of mapped pools, with ml_dtypes and (against a real daemon with
bf16 and fp8 pools) without it; and tuning.tune_for_block_streams, seen from gRPC's own log.
"""

import array
import importlib.util
import os
import subprocess
import sys
import types
import unittest

import grpc
import numpy

from daemon import BOUND, SOURCE_DIR, Daemon

from kvcache_client import DType, KvCacheError, _calls
from kvcache_client.mapped_pool import element_type

Code = grpc.StatusCode


def lookup_error(tokens) -> str:
    try:
        _calls.lookup("default", tokens, b"", None, "")
    except KvCacheError as error:
        if error.code != Code.INVALID_ARGUMENT:
            raise
        return error.message
    raise AssertionError(f"tokens {tokens!r} were accepted")


class TokenTest(unittest.TestCase):
    def test_accepted_kinds_give_the_same_request(self):
        expected = list(range(7, 71))
        for given in (expected, tuple(expected), range(7, 71), iter(expected),
                      array.array("I", expected), numpy.arange(7, 71, dtype=numpy.uint32),
                      numpy.arange(7, 71, dtype=numpy.int64),
                      [numpy.int32(token) for token in expected]):
            with self.subTest(kind=type(given).__name__):
                request = _calls.lookup("default", given, b"", None, "").request
                self.assertEqual(list(request.tokens), expected)

    def test_the_first_bad_token_is_named(self):
        self.assertEqual(lookup_error([5, 6, -1, 2**40]),
                         "lookup: token 2 is -1; token ids are uint32")
        self.assertEqual(lookup_error([0, 2**32]),
                         "lookup: token 1 is 4294967296; token ids are uint32")
        self.assertEqual(lookup_error([1, "2"]), "lookup: token 1 is a str; token ids are uint32")
        self.assertEqual(lookup_error([1.0]), "lookup: token 0 is a float; token ids are uint32")
        self.assertEqual(lookup_error("12"), "lookup: token 0 is a str; token ids are uint32")
        self.assertEqual(lookup_error(5), "lookup: tokens must be a sequence of integers, not int")
        self.assertEqual(lookup_error(numpy.array([3, 4, -5])),
                         "lookup: token 2 is -5; token ids are uint32")
        self.assertEqual(lookup_error(numpy.array([1, 2**32], dtype=numpy.uint64)),
                         "lookup: token 1 is 4294967296; token ids are uint32")
        self.assertIn("1-D integer array", lookup_error(numpy.zeros((2, 2), dtype=numpy.int32)))
        self.assertIn("1-D integer array", lookup_error(numpy.zeros(4)))

    def test_other_fields_are_named_by_type_not_value(self):
        try:
            _calls.lookup("default", [1], "secret-salt", None, "")  # a str, not bytes
        except KvCacheError as error:
            self.assertEqual(error.message, "lookup: cache_salt (str) has the wrong type")
            self.assertNotIn("secret", str(error))
        else:
            self.fail("a str salt was accepted")


class ElementTypeTest(unittest.TestCase):
    def test_without_ml_dtypes_bf16_and_fp8_are_their_bits(self):
        self.assertEqual(element_type(DType.FLOAT16, None), numpy.float16)
        self.assertEqual(element_type(DType.FLOAT32, None), numpy.float32)
        self.assertEqual(element_type(DType.BFLOAT16, None), numpy.uint16)
        self.assertEqual(element_type(DType.FP8_E4M3, None), numpy.uint8)

    def test_ml_dtypes_types_are_used_when_present(self):
        # The shape of the ml_dtypes module: numpy-compatible scalar types by these names.
        bf16 = numpy.dtype([("bits", numpy.uint16)])
        fp8 = numpy.dtype([("bits", numpy.uint8)])
        module = types.SimpleNamespace(bfloat16=bf16, float8_e4m3fn=fp8)
        self.assertEqual(element_type(DType.BFLOAT16, module), bf16)
        self.assertEqual(element_type(DType.FP8_E4M3, module), fp8)
        self.assertEqual(element_type(DType.FLOAT16, module), numpy.float16)
        # A module without the type (an old ml_dtypes), or with one of another width: the bits.
        self.assertEqual(element_type(DType.FP8_E4M3, types.SimpleNamespace()), numpy.uint8)
        wide = types.SimpleNamespace(bfloat16=numpy.dtype(numpy.float32))
        self.assertEqual(element_type(DType.BFLOAT16, wide), numpy.uint16)

    def test_mapped_bf16_and_fp8_pools(self):
        installed = importlib.util.find_spec("ml_dtypes") is not None
        daemon = Daemon(pool="default:dtype=bf16:blocks=8,fp8:dtype=fp8:blocks=8")
        self.addCleanup(daemon.cleanup)
        with daemon.client() as client, client.open_session("dtypes") as session:
            for pool, expected in (("default", "bfloat16" if installed else "uint16"),
                                   ("fp8", "float8_e4m3fn" if installed else "uint8")):
                with self.subTest(pool=pool), session.map_pool(pool) as mapped:
                    self.assertEqual(mapped.element_type.name, expected)
                    self.assertEqual(mapped.keys(0, 0).dtype, mapped.element_type)
                    self.assertEqual(mapped.kv(0).nbytes, mapped.block_bytes)


# Tunes, then makes a channel (gRPC starts and logs its settings) and gets a block through it.
TUNED_PROCESS = """
import sys
import grpc
from kvcache_client import Client
from kvcache_client.tuning import tune_for_block_streams
print("tuned", tune_for_block_streams(), flush=True)
with Client(sys.argv[1]) as client, client.open_session("tuned") as session:
    session.put_blocks("default", list(range(16)), bytes(client.describe_pool(
        "default").pool.layout.block_bytes))
    print("got", session.get_blocks("default", list(range(16)))[0].num_blocks, flush=True)
"""


class TuningTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.cleanup()

    def run_tuned(self, **env) -> str:
        environment = {name: value for name, value in os.environ.items()
                       if not name.startswith("GRPC_")}
        environment.update(env, GRPC_VERBOSITY="DEBUG",
                           PYTHONPATH=os.path.join(SOURCE_DIR, "client", "python"))
        done = subprocess.run([sys.executable, "-c", TUNED_PROCESS, self.daemon.target],
                              env=environment, capture_output=True, text=True, timeout=BOUND)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("got 1", done.stdout)
        return done.stdout + done.stderr

    def test_grpc_starts_with_the_settings(self):
        log = self.run_tuned()
        self.assertIn("tuned True", log)
        self.assertIn("Using polling engine: poll", log)
        self.assertRegex(log, r"EXPERIMENT tcp_read_chunks +OFF")

    def test_the_operators_choice_wins(self):
        log = self.run_tuned(GRPC_POLL_STRATEGY="epoll1")
        self.assertIn("tuned False", log)
        self.assertIn("Using polling engine: epoll1", log)
        self.assertRegex(log, r"EXPERIMENT tcp_read_chunks +OFF")


if __name__ == "__main__":
    unittest.main()
