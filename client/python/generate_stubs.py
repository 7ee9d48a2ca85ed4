#!/usr/bin/python3
"""Generates kvcache_client/_proto/ (kvcache.v1 messages and gRPC stubs) from proto/.

The stubs are committed so that the package imports from the source tree and installs with
`pip install client/python` on machines without protoc; the build regenerates them
(`python_client_stubs`) and the test `python_client_stubs_current` fails when the committed copy
differs, so they are never stale.

protoc also writes the messages' type stubs (kvcache_pb2.pyi, `--pyi_out`) so that type checkers
read the generated classes; with the package's py.typed marker (PEP 561) users' mypy checks
their calls into kvcache_client.

protoc names the message module after the proto's path (`kvcache.v1.kvcache_pb2`) and the gRPC
module imports it by that absolute name; inside our package it is a sibling, so that one import
is rewritten to a relative one. The proto is compiled as `kvcache/v1/kvcache.proto`, its
canonical name, so its descriptor is the same as in any other stubs generated from it.

Usage: generate_stubs.py [--protoc PROTOC] [--plugin GRPC_PYTHON_PLUGIN] --proto_dir DIR --out DIR
       generate_stubs.py --check [--protoc ...] [--plugin ...] --proto_dir DIR --out DIR
       generate_stubs.py --compare GENERATED_DIR --out DIR
  --check    compares freshly generated files with those in --out instead of writing them;
  --compare  compares the files the build generated (GENERATED_DIR) with those in --out.
  Both exit 1, naming the files, when they differ.
"""

import argparse
import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Dict, List

PROTO = "kvcache/v1/kvcache.proto"
ABSOLUTE_IMPORT = "from kvcache.v1 import kvcache_pb2 as"
RELATIVE_IMPORT = "from . import kvcache_pb2 as"
GENERATED = ("kvcache_pb2.py", "kvcache_pb2.pyi", "kvcache_pb2_grpc.py")
PACKAGE_FILES = ("__init__.py",) + GENERATED
PACKAGE_INIT = ('"""Generated kvcache.v1 messages and gRPC stubs (client/python/generate_stubs.py);'
                ' do not edit."""\n')


def generate(protoc: str, plugin: str, proto_dir: str) -> Dict[str, str]:
    """Runs protoc; returns the package's files (name -> text), imports rewritten."""
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([protoc, "-I" + proto_dir, "--python_out=" + out, "--pyi_out=" + out,
                        "--grpc_out=" + out,
                        "--plugin=protoc-gen-grpc=" + plugin, os.path.join(proto_dir, PROTO)],
                       check=True)
        files = {"__init__.py": PACKAGE_INIT}
        for name in GENERATED:
            with open(os.path.join(out, "kvcache", "v1", name)) as file:
                files[name] = file.read()
    grpc_module = files["kvcache_pb2_grpc.py"]
    if ABSOLUTE_IMPORT not in grpc_module:
        raise RuntimeError("grpc_python_plugin's output no longer imports the messages as "
                           f"'{ABSOLUTE_IMPORT}': update {__file__}")
    files["kvcache_pb2_grpc.py"] = grpc_module.replace(ABSOLUTE_IMPORT, RELATIVE_IMPORT)
    return files


def stale_files(generated_dir: str, committed_dir: str) -> List[str]:
    """The package's files that differ between the two folders (or are missing from one)."""
    _, mismatch, missing = filecmp.cmpfiles(generated_dir, committed_dir, sorted(PACKAGE_FILES),
                                            shallow=False)
    return mismatch + missing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--compare", metavar="GENERATED_DIR")
    parser.add_argument("--protoc", default=shutil.which("protoc") or "protoc")
    parser.add_argument("--plugin", default="/usr/bin/grpc_python_plugin")
    parser.add_argument("--proto_dir")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.compare is None and args.proto_dir is None:
        parser.error("--proto_dir is required unless --compare is given")
    with tempfile.TemporaryDirectory() as fresh:
        if args.compare is not None:
            stale = stale_files(args.compare, args.out)
        else:
            files = generate(args.protoc, args.plugin, args.proto_dir)
            target = fresh if args.check else args.out
            os.makedirs(target, exist_ok=True)
            for name, text in files.items():
                with open(os.path.join(target, name), "w") as file:
                    file.write(text)
            stale = stale_files(fresh, args.out) if args.check else []
    if stale:
        print(f"{args.out}: {', '.join(stale)} differ from what {PROTO} generates; run "
              f"client/python/generate_stubs.py --proto_dir proto --out {args.out} and commit",
              file=sys.stderr)
        return 1
    return 0

if __name__ == "__main__":
    sys.exit(main())
