#!/usr/bin/env python3
"""Writes a deterministic tiny Qwen3-MoE checkpoint (config.json + model.safetensors).

Usage: make_tiny_checkpoint.py OUT_DIR [--dtype bf16|f16|f32] [--seed N] [--layers N]
                               [--hidden N] [--moe_intermediate N] [--variant qwen3_moe|hybrid]

--variant hybrid writes a tiny Qwen3-Next instead (model_type "qwen3_next", Hugging Face's
Qwen3NextForCausalLM names and shapes): with full_attention_interval 4, layers 0-2 are Gated
DeltaNet (linear attention) and layer 3 gated full attention, every layer an MoE with a shared
expert. Its zero-centred RMSNorm weights (applied as 1 + w) are N(0, 0.05); A_log and dt_bias
give decays exp(-A softplus(a + dt_bias)) around 0.85-0.99, so the recurrent state remembers
many tokens back and a wrong state shows in the logits.

The defaults are the tests' model. A wider one (e.g. --hidden 512 --moe_intermediate 512) keeps
the KV layout (heads and head_dim are unchanged) but makes the per-token projections and experts,
not attention, dominate prefill, as they do in real MoE models at these context lengths: that is
the model the prefill benchmark reports on.

The weights come from random.Random(seed) only, so the same arguments give byte-identical files
on every machine (standard library only: no numpy, no torch). Scales keep activations O(1) so the
model's logits, attention and routing are far from degenerate: projections are N(0, 1/sqrt(in)),
embeddings N(0, 1), norm weights 1 + N(0, 0.05). Tensor names and shapes follow Hugging Face's
Qwen3MoeForCausalLM (a Linear weight is [out, in]).
"""

import argparse
import json
import math
import os
import random
import struct
import sys

CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_act": "silu",
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 256,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "use_sliding_window": False,
    "torch_dtype": "bfloat16",
}

HYBRID_CONFIG = dict(CONFIG, **{
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "shared_expert_intermediate_size": 48,
    "num_hidden_layers": 4,
    "full_attention_interval": 4,
    "partial_rotary_factor": 0.25,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
})
del HYBRID_CONFIG["use_sliding_window"]

DTYPES = {"bf16": ("BF16", 2), "f16": ("F16", 2), "f32": ("F32", 4)}


def float_to_bf16_bits(value):
    """float32 bits rounded to bfloat16, nearest-even (values here are finite)."""
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    bits += 0x7FFF + ((bits >> 16) & 1)
    return (bits >> 16) & 0xFFFF


def encode(values, dtype):
    if dtype == "f32":
        return struct.pack("<%df" % len(values), *values)
    if dtype == "f16":  # struct's "e" rounds to nearest-even IEEE binary16
        return struct.pack("<%de" % len(values), *values)
    return struct.pack("<%dH" % len(values), *(float_to_bf16_bits(v) for v in values))


def tensor_specs(cfg):
    """(name, shape, kind) in a fixed order; kind picks the initializer."""
    hidden, head_dim = cfg["hidden_size"], cfg["head_dim"]
    q_dim = cfg["num_attention_heads"] * head_dim
    kv_dim = cfg["num_key_value_heads"] * head_dim
    moe, vocab = cfg["moe_intermediate_size"], cfg["vocab_size"]
    specs = [("model.embed_tokens.weight", [vocab, hidden], "embed")]
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        specs += [
            (p + "input_layernorm.weight", [hidden], "norm"),
            (p + "self_attn.q_proj.weight", [q_dim, hidden], "linear"),
            (p + "self_attn.k_proj.weight", [kv_dim, hidden], "linear"),
            (p + "self_attn.v_proj.weight", [kv_dim, hidden], "linear"),
            (p + "self_attn.o_proj.weight", [hidden, q_dim], "linear"),
            (p + "self_attn.q_norm.weight", [head_dim], "norm"),
            (p + "self_attn.k_norm.weight", [head_dim], "norm"),
            (p + "post_attention_layernorm.weight", [hidden], "norm"),
            (p + "mlp.gate.weight", [cfg["num_experts"], hidden], "linear"),
        ]
        for e in range(cfg["num_experts"]):
            ep = p + "mlp.experts.%d." % e
            specs += [
                (ep + "gate_proj.weight", [moe, hidden], "linear"),
                (ep + "up_proj.weight", [moe, hidden], "linear"),
                (ep + "down_proj.weight", [hidden, moe], "linear"),
            ]
    specs.append(("model.norm.weight", [hidden], "norm"))
    if not cfg["tie_word_embeddings"]:
        specs.append(("lm_head.weight", [vocab, hidden], "linear"))
    return specs


def mlp_specs(prefix, hidden, intermediate):
    return [
        (prefix + "gate_proj.weight", [intermediate, hidden], "linear"),
        (prefix + "up_proj.weight", [intermediate, hidden], "linear"),
        (prefix + "down_proj.weight", [hidden, intermediate], "linear"),
    ]


def layer_is_full_attention(cfg, i):
    return (i + 1) % cfg["full_attention_interval"] == 0


def hybrid_tensor_specs(cfg):
    """Qwen3NextForCausalLM's tensors; "centered" norms are applied as 1 + w."""
    hidden, head_dim = cfg["hidden_size"], cfg["head_dim"]
    q_dim = cfg["num_attention_heads"] * head_dim
    kv_dim = cfg["num_key_value_heads"] * head_dim
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    hk, hv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    key_dim, value_dim = nk * hk, nv * hv
    vocab = cfg["vocab_size"]
    specs = [("model.embed_tokens.weight", [vocab, hidden], "embed")]
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        specs.append((p + "input_layernorm.weight", [hidden], "centered"))
        if layer_is_full_attention(cfg, i):
            a = p + "self_attn."
            specs += [
                (a + "q_proj.weight", [2 * q_dim, hidden], "linear"),
                (a + "k_proj.weight", [kv_dim, hidden], "linear"),
                (a + "v_proj.weight", [kv_dim, hidden], "linear"),
                (a + "o_proj.weight", [hidden, q_dim], "linear"),
                (a + "q_norm.weight", [head_dim], "centered"),
                (a + "k_norm.weight", [head_dim], "centered"),
            ]
        else:
            a = p + "linear_attn."
            specs += [
                (a + "in_proj_qkvz.weight", [2 * key_dim + 2 * value_dim, hidden], "linear"),
                (a + "in_proj_ba.weight", [2 * nv, hidden], "linear"),
                (a + "conv1d.weight", [2 * key_dim + value_dim, 1, cfg["linear_conv_kernel_dim"]],
                 "linear"),
                (a + "dt_bias", [nv], "dt_bias"),
                (a + "A_log", [nv], "a_log"),
                (a + "norm.weight", [hv], "norm"),
                (a + "out_proj.weight", [hidden, value_dim], "linear"),
            ]
        specs.append((p + "post_attention_layernorm.weight", [hidden], "centered"))
        specs.append((p + "mlp.gate.weight", [cfg["num_experts"], hidden], "linear"))
        for e in range(cfg["num_experts"]):
            specs += mlp_specs(p + "mlp.experts.%d." % e, hidden, cfg["moe_intermediate_size"])
        specs += mlp_specs(p + "mlp.shared_expert.", hidden,
                           cfg["shared_expert_intermediate_size"])
        specs.append((p + "mlp.shared_expert_gate.weight", [1, hidden], "linear"))
    specs.append(("model.norm.weight", [hidden], "centered"))
    if not cfg["tie_word_embeddings"]:
        specs.append(("lm_head.weight", [vocab, hidden], "linear"))
    return specs


def init_values(rng, shape, kind):
    count = math.prod(shape)
    if kind == "norm":
        return [1.0 + rng.gauss(0.0, 0.05) for _ in range(count)]
    if kind == "centered":
        return [rng.gauss(0.0, 0.05) for _ in range(count)]
    if kind == "dt_bias":
        return [-1.0 + rng.gauss(0.0, 0.2) for _ in range(count)]
    if kind == "a_log":
        return [math.log(rng.uniform(0.02, 0.5)) for _ in range(count)]
    std = 1.0 if kind == "embed" else 1.0 / math.sqrt(shape[-1])
    return [rng.gauss(0.0, std) for _ in range(count)]


def write_safetensors(path, tensors, dtype):
    """tensors: list of (name, shape, bytes) laid out in that order."""
    dtype_name, _ = DTYPES[dtype]
    header = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape, data in tensors:
        header[name] = {"dtype": dtype_name, "shape": shape,
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    header_bytes = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    header_bytes += b" " * (-len(header_bytes) % 8)  # the data section starts 8-byte aligned
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(header_bytes)))
        out.write(header_bytes)
        for _, _, data in tensors:
            out.write(data)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layers", type=int, default=None,
                        help="default: 3 (qwen3_moe), 4 (hybrid)")
    parser.add_argument("--hidden", type=int, default=CONFIG["hidden_size"])
    parser.add_argument("--moe_intermediate", type=int, default=CONFIG["moe_intermediate_size"])
    parser.add_argument("--variant", choices=["qwen3_moe", "hybrid"], default="qwen3_moe")
    args = parser.parse_args(argv)
    hybrid = args.variant == "hybrid"
    base = HYBRID_CONFIG if hybrid else CONFIG
    if args.layers is None:
        args.layers = base["num_hidden_layers"]
    if args.layers < 1 or args.hidden < 1 or args.moe_intermediate < 1:
        parser.error("--layers, --hidden and --moe_intermediate must be at least 1")

    cfg = dict(base)
    cfg["num_hidden_layers"] = args.layers
    cfg["hidden_size"] = args.hidden
    cfg["intermediate_size"] = 2 * args.hidden
    cfg["moe_intermediate_size"] = args.moe_intermediate
    cfg["torch_dtype"] = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}[args.dtype]
    rng = random.Random(args.seed)
    tensors = []
    for name, shape, kind in (hybrid_tensor_specs if hybrid else tensor_specs)(cfg):
        tensors.append((name, shape, encode(init_values(rng, shape, kind), args.dtype)))

    os.makedirs(args.out_dir, exist_ok=True)
    # Write to temporary names and rename, so an interrupted run never leaves a half checkpoint.
    weights = os.path.join(args.out_dir, "model.safetensors")
    config = os.path.join(args.out_dir, "config.json")
    write_safetensors(weights + ".tmp", tensors, args.dtype)
    with open(config + ".tmp", "w", encoding="utf-8") as out:
        json.dump(cfg, out, indent=2, sort_keys=True)
        out.write("\n")
    os.replace(weights + ".tmp", weights)
    os.replace(config + ".tmp", config)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
