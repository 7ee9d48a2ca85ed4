"""Python client pieces for kvcache. `hashing` reproduces the block hash chain (docs/hash_spec.md)."""
