"""An engine plug-in's manifest: KV stored under one config never serves another
(docs/engines.md, "Engine plug-ins: the compatibility manifest")."""
import hashlib
import json
import sys

from kvcache_client import (Client, CompatibilityManifest, KvCacheError, PagePart,
                            ParallelGeometry)


def config_digest(hf_config: dict, max_model_len: int) -> bytes:
    """Whatever in the engine's config changes the KV, canonically encoded, then hashed."""
    kv_relevant = {key: hf_config.get(key) for key in (
        "architectures", "num_hidden_layers", "num_key_value_heads", "head_dim", "rope_theta",
        "rope_scaling", "sliding_window")}
    kv_relevant["max_model_len"] = max_model_len
    return hashlib.sha256(json.dumps(kv_relevant, sort_keys=True).encode()).digest()


def manifest_for(layout, hf_config: dict, max_model_len: int, tp_size: int, tp_rank: int):
    return CompatibilityManifest(
        model_id="meta-llama/Llama-3.1-8B-Instruct",
        model_config_digest=config_digest(hf_config, max_model_len),
        kv_dtype="fp16", page_tokens=layout.block_size,
        parts=(PagePart("kv", layout.block_bytes),),
        parallel=ParallelGeometry(tp_size=tp_size, tp_rank=tp_rank))


target = sys.argv[1] if len(sys.argv) > 1 else None  # None: the daemon's default socket
config = {"architectures": ["LlamaForCausalLM"], "rope_theta": 500000.0,
          "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
with Client(target) as client:
    layout = client.describe_pool("default").pool.layout
    prompt = list(range(3000, 3040))  # 2 full blocks of 16 tokens, and 8 more
    rank0 = manifest_for(layout, config, 131072, tp_size=2, tp_rank=0)
    with client.open_session("engine-rank0", manifest=rank0) as session:  # one per process
        sequence = session.open_sequence("default", prompt)
        session.commit(sequence.sequence_id, len(prompt))  # after writing the prompt's KV
        session.release(sequence.sequence_id)
        print("same manifest:", client.lookup("default", prompt, manifest=rank0).num_cached_tokens)
    longer = manifest_for(layout, config, 262144, tp_size=2, tp_rank=0)  # max length changed
    print("changed config:", client.lookup("default", prompt, manifest=longer).num_cached_tokens)
    try:
        client.open_session("bad", manifest=manifest_for(layout, config, 131072, 2, tp_rank=2))
    except KvCacheError as error:
        print("bad manifest:", error.code.name)
