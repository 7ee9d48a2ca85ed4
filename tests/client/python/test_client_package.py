"""The Python client as a user gets it: the wheel, built here (into KVCACHE_WHEEL_DIR) offline
with Debian's setuptools, holds the typed package (py.typed, the messages' .pyi, the asyncio
client); installed into a fresh virtualenv over Debian's python3-* packages (its dependencies,
python3-xxhash declaring version 0.0.0 among them) it talks to a real daemon, blocking and
asyncio, and a type checker reads it: a user's type error in a call is reported. The package
itself passes mypy with every function annotated (client/python/pyproject.toml).
"""

import glob
import os
import re
import shutil
import subprocess
import tempfile
import unittest
import zipfile

from daemon import BOUND, SOURCE_DIR, Daemon

PYTHON = "/usr/bin/python3"  # Debian's, whose site-packages hold the dependencies
WHEEL_DIR = os.environ.get("KVCACHE_WHEEL_DIR") or tempfile.mkdtemp(prefix="kvpy-wheel-")

SMOKE = '''
import asyncio, sys
import numpy
import kvcache_client
from kvcache_client import Client, aio

target = sys.argv[1]
with Client(target) as client, client.open_session("wheel") as session:
    block_bytes = client.describe_pool("default").pool.layout.block_bytes
    prompt = list(range(100, 132))
    session.put_blocks("default", prompt, numpy.full(2 * block_bytes, 7, dtype=numpy.uint8))
    print("lookup", client.lookup("default", prompt).num_cached_tokens)
    first = next(client.watch_events())
    print("watch", [event.WhichOneof("kind") for event in first.events][:2])

async def main():
    async with aio.Client(target) as client:
        print("aio lookup", (await client.lookup("default", prompt)).num_cached_tokens)
asyncio.run(main())
print("from", kvcache_client.__file__)
print("version", kvcache_client.__version__)
'''

# A user's code with a deliberate type error: an int plus a str.
TYPED_USE = '''
from kvcache_client import Client, aio

def cached(client: Client, tokens: list[int]) -> int:
    return client.lookup("default", tokens).num_cached_tokens + "x"

async def cached_async(client: aio.Client, tokens: list[int]) -> str:
    return (await client.lookup("default", tokens)).num_cached_tokens
'''


def project_version() -> str:
    """The project's version, as CMakeLists.txt declares it."""
    with open(os.path.join(SOURCE_DIR, "CMakeLists.txt")) as file:
        return re.search(r"project\(kvcache VERSION (\S+)", file.read()).group(1)


def has_mypy() -> bool:
    return subprocess.run([PYTHON, "-m", "mypy", "--version"], capture_output=True).returncode == 0


class ExportsTest(unittest.TestCase):
    def test_a_star_import_shadows_nothing_of_typing(self):
        """`from kvcache_client import *` binds OpenedSequence, not a `Sequence` that would shadow
        typing.Sequence (the old name stays importable by name)."""
        import typing

        import kvcache_client
        names = {}
        exec("from typing import Sequence\nfrom kvcache_client import *", names)
        self.assertIs(names["Sequence"], typing.Sequence)
        self.assertIs(names["OpenedSequence"], kvcache_client.OpenedSequence)
        self.assertIs(kvcache_client.Sequence, kvcache_client.OpenedSequence)
        for name in kvcache_client.__all__:
            self.assertFalse(hasattr(typing, name), name)


class WheelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.TemporaryDirectory(prefix="kvpy-pkg-")
        # pip builds in the tree it is given: build from a copy, not the source tree.
        source = os.path.join(cls.work.name, "python")
        shutil.copytree(os.path.join(SOURCE_DIR, "client", "python"), source,
                        ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
        os.makedirs(WHEEL_DIR, exist_ok=True)
        for old in glob.glob(os.path.join(WHEEL_DIR, "kvcache_client-*.whl")):
            os.remove(old)
        cls.run_checked([PYTHON, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                         "--no-index", "--quiet", "--wheel-dir", WHEEL_DIR, source])
        [cls.wheel] = glob.glob(os.path.join(WHEEL_DIR, "kvcache_client-*-py3-none-any.whl"))
        cls.venv = os.path.join(cls.work.name, "venv")
        cls.run_checked([PYTHON, "-m", "venv", "--system-site-packages", cls.venv])
        cls.python = os.path.join(cls.venv, "bin", "python")
        # With its dependencies, offline: Debian's packages satisfy them.
        cls.run_checked([cls.python, "-m", "pip", "install", "--no-index", "--quiet", cls.wheel])
        cls.daemon = Daemon()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.cleanup()
        cls.work.cleanup()

    @staticmethod
    def run_checked(command, cwd=None) -> str:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True,
                              timeout=BOUND * 4, env=dict(os.environ, PYTHONPATH=""))
        if done.returncode != 0:
            raise AssertionError(f"{' '.join(command)}: exit {done.returncode}\n{done.stdout}"
                                 f"{done.stderr}")
        return done.stdout

    def test_wheel_holds_the_typed_package(self):
        names = set(zipfile.ZipFile(self.wheel).namelist())
        for name in ("kvcache_client/py.typed", "kvcache_client/aio.py",
                     "kvcache_client/_proto/kvcache_pb2.pyi",
                     "kvcache_client/_proto/kvcache_pb2_grpc.py"):
            self.assertIn(name, names)
        metadata = zipfile.ZipFile(self.wheel).read(
            [name for name in names if name.endswith("dist-info/METADATA")][0]).decode()
        # Any xxhash: Debian's python3-xxhash declares 0.0.0.
        self.assertIn("Requires-Dist: xxhash\n", metadata)
        # The project's version and licence (CMakeLists.txt's, LICENSE's).
        self.assertIn(f"Version: {project_version()}\n", metadata)
        self.assertIn("License: Apache-2.0\n", metadata)

    def test_installed_wheel_talks_to_a_daemon(self):
        with tempfile.TemporaryDirectory() as elsewhere:  # not the source tree's package
            output = self.run_checked([self.python, "-c", SMOKE, self.daemon.target], elsewhere)
        lines = output.splitlines()
        self.assertEqual(lines[:3], ["lookup 32", "watch ['all_blocks_cleared', 'blocks_stored']",
                                     "aio lookup 32"])
        self.assertTrue(lines[3].startswith("from " + self.venv), lines[3])
        self.assertEqual(lines[4], "version " + project_version())
        pip_check = subprocess.run([self.python, "-m", "pip", "check"], capture_output=True,
                                   text=True)
        self.assertNotIn("kvcache-client", pip_check.stdout)

    @unittest.skipUnless(has_mypy(), "no mypy (Debian: python3-mypy)")
    def test_type_checkers_read_the_installed_package(self):
        with tempfile.TemporaryDirectory() as elsewhere:
            path = os.path.join(elsewhere, "typed_use.py")
            with open(path, "w") as file:
                file.write(TYPED_USE)
            done = subprocess.run([self.python, "-m", "mypy", "--cache-dir=/dev/null", path],
                                  cwd=elsewhere, capture_output=True, text=True, timeout=BOUND * 4)
        self.assertNotIn("py.typed", done.stdout)
        self.assertIn('typed_use.py:5: error: Unsupported operand types for + ("int" and "str")',
                      done.stdout)
        self.assertIn('typed_use.py:8: error: Incompatible return value type (got "int", '
                      'expected "str")', done.stdout)

    @unittest.skipUnless(has_mypy(), "no mypy (Debian: python3-mypy)")
    def test_the_package_is_annotated_throughout(self):
        done = subprocess.run([PYTHON, "-m", "mypy", "--cache-dir=/dev/null", "kvcache_client"],
                              cwd=os.path.join(SOURCE_DIR, "client", "python"),
                              capture_output=True, text=True, timeout=BOUND * 4)
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)


if __name__ == "__main__":
    unittest.main()
