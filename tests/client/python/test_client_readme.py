"""README "Using the Python client": the example shown is client/python/examples/quickstart.py,
verbatim, and the section's commands run and print what the README says, against a daemon on
the default socket: the example from the source tree, and the package installed by pip into a
virtualenv over Debian's packages, dependencies included (Debian's python3-xxhash declares
version 0.0.0, which a version bound would refuse), running the same example. The bench/python_client_bench.py command of
docs/benchmarks.md ("Running them") runs too (a short smoke run; its figures are not checked).
"""

import os
import re
import shutil
import subprocess
import tempfile
import unittest

from daemon import BIN_DIR, BOUND, SOURCE_DIR, Daemon

EXPECTED_OUTPUT = "cached tokens: 32\ngot blocks: 2 identical: True\nerror code: NOT_FOUND\n"
# Appended to the README's pip command: no index (the dependencies are Debian's packages).
PIP_OFFLINE = "--no-index --quiet"


def readme_section(title: str, path: str = "README.md") -> str:
    with open(os.path.join(SOURCE_DIR, path)) as file:
        text = file.read()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def code_blocks(section: str, language: str) -> list:
    return re.findall(rf"```{language}\n(.*?)```", section, re.S)


class ReadmePythonTest(unittest.TestCase):
    def setUp(self):
        self.section = readme_section("Using the Python client")
        self.runtime_dir = tempfile.TemporaryDirectory(prefix="kvpy-run-")
        self.addCleanup(self.runtime_dir.cleanup)
        # The daemon's and the client's default target: $XDG_RUNTIME_DIR/kvcache/kv.sock.
        self.env = dict(os.environ, XDG_RUNTIME_DIR=self.runtime_dir.name,
                        PATH="/usr/bin:" + os.environ.get("PATH", ""))
        self.env.pop("PYTHONPATH", None)
        self.daemon = Daemon(listen=f"unix://{self.runtime_dir.name}/kvcache/kv.sock")
        self.addCleanup(self.daemon.cleanup)

    def run_shell(self, command: str, cwd: str) -> str:
        done = subprocess.run(["bash", "-c", command], cwd=cwd, env=self.env,
                              capture_output=True, text=True, timeout=BOUND * 4)
        self.assertEqual(done.returncode, 0, f"{command}: {done.stderr}")
        return done.stdout

    def test_example_is_the_file_the_commands_run(self):
        [example] = code_blocks(self.section, "python")
        with open(os.path.join(SOURCE_DIR, "client/python/examples/quickstart.py")) as file:
            self.assertEqual(example, file.read())
        for line in EXPECTED_OUTPUT.splitlines():  # what the README says it prints
            self.assertIn(f"`{line}`", self.section)

    def test_commands(self):
        [commands] = code_blocks(self.section, "sh")
        lines = [line.split("  #")[0].strip() for line in commands.splitlines() if line.strip()]
        self.assertEqual(len(lines), 2, lines)
        run_example, install = lines
        self.assertEqual(self.run_shell(run_example, SOURCE_DIR), EXPECTED_OUTPUT)

        if subprocess.run(["/usr/bin/python3", "-m", "pip", "--version"],
                          capture_output=True).returncode != 0:
            self.skipTest("no pip for /usr/bin/python3 (Debian: python3-pip)")
        # pip builds in the tree it installs from: install from a copy, not the source tree.
        with tempfile.TemporaryDirectory(prefix="kvpy-pip-") as work:
            shutil.copytree(os.path.join(SOURCE_DIR, "client", "python"),
                            os.path.join(work, "client", "python"),
                            ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info",
                                                          ".mypy_cache"))
            self.run_shell(f"{install} {PIP_OFFLINE}", work)
            python = os.path.join(work, ".venv", "bin", "python")
            # The installed package, not the source tree's, runs the same example.
            example = os.path.join(work, "client", "python", "examples", "quickstart.py")
            where = self.run_shell(f"{python} -c 'import kvcache_client; "
                                   "print(kvcache_client.__file__)'", "/")
            self.assertTrue(where.startswith(os.path.join(work, ".venv")), where)
            self.assertEqual(self.run_shell(f"{python} {example}", "/"), EXPECTED_OUTPUT)


class ReadmeManifestTest(unittest.TestCase):
    """docs/engines.md "Engine plug-ins: the compatibility manifest": the example shown is
    client/python/examples/engine_manifest.py, verbatim, and run against a daemon it prints what
    the page says."""

    def test_example_runs_and_prints_what_the_readme_says(self):
        section = readme_section("Engine plug-ins: the compatibility manifest", "docs/engines.md")
        [example] = code_blocks(section, "python")
        path = os.path.join(SOURCE_DIR, "client/python/examples/engine_manifest.py")
        with open(path) as file:
            self.assertEqual(example, file.read())
        daemon = Daemon()
        self.addCleanup(daemon.cleanup)
        done = subprocess.run(["/usr/bin/python3", path, daemon.target],
                              env=dict(os.environ,
                                       PYTHONPATH=os.path.join(SOURCE_DIR, "client/python")),
                              capture_output=True, text=True, timeout=BOUND * 4)
        self.assertEqual(done.returncode, 0, done.stderr)
        printed = "same manifest: 32\nchanged config: 0\nbad manifest: INVALID_ARGUMENT\n"
        self.assertEqual(done.stdout, printed)
        for line in printed.splitlines():
            self.assertIn(f"`{line}`", section)


class BenchmarkSmokeTest(unittest.TestCase):
    def test_python_client_bench_prints_a_ratio(self):
        [commands] = code_blocks(readme_section("Running them", "docs/benchmarks.md"), "sh")
        [line] = [line for line in commands.splitlines() if "python_client_bench" in line]
        script = line.split()[1]
        done = subprocess.run(["/usr/bin/python3", os.path.join(SOURCE_DIR, script), "0.05", "1"],
                              env=dict(os.environ, KVCACHE_BIN_DIR=BIN_DIR),
                              capture_output=True, text=True, timeout=BOUND * 4)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertRegex(done.stdout, r"ratio python / c\+\+: \d+\.\d\d")


if __name__ == "__main__":
    unittest.main()
