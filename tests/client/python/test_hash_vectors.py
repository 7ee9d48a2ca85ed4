"""The Python hash-chain reference reproduces docs/hash_test_vectors.tsv."""

import csv
import os
import sys
import unittest

SOURCE_DIR = os.environ.get("KVCACHE_SOURCE_DIR",
                            os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(SOURCE_DIR, "client", "python"))

from kvcache_client import hashing  # noqa: E402


def parse_items(text):
    items = []
    for entry in filter(None, text.split(";")):
        content_hash, span = entry.split("@")
        offset, length = span.split("+")
        items.append(hashing.MultimodalItem(content_hash.encode(), int(offset), int(length)))
    return items


class HashVectorTest(unittest.TestCase):
    def test_reproduces_every_vector(self):
        path = os.path.join(SOURCE_DIR, "docs", "hash_test_vectors.tsv")
        with open(path, newline="") as file:
            rows = list(csv.DictReader(file, delimiter="\t", quoting=csv.QUOTE_NONE))
        self.assertEqual(len(rows), 12)
        for row in rows:
            with self.subTest(row["name"]):
                fingerprint = hashing.layout_fingerprint(
                    int(row["layers"]), int(row["kv_heads"]), int(row["head_dim"]),
                    int(row["block_size"]), row["dtype"])
                self.assertEqual(f"{fingerprint:016x}", row["fingerprint"])
                root = hashing.root_hash(row["algorithm"], row["model_id"].encode(), fingerprint,
                                         row["tenant"].encode(), row["cache_salt"].encode())
                self.assertEqual(root.hex(), row["root"])
                extras = hashing.ExtraKeys(row["lora_id"].encode(),
                                           parse_items(row["multimodal_items"]))
                tokens = [int(token) for token in row["tokens"].split(",")]
                hashes = hashing.chain_hashes(row["algorithm"], root, tokens,
                                              int(row["block_size"]), extras)
                self.assertEqual([h.hex() for h in hashes], row["block_hashes"].split(","))


if __name__ == "__main__":
    unittest.main()
