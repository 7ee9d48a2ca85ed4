#!/usr/bin/env python3
"""An independent float64 reference of the Qwen3-MoE forward pass, standard library only.

Usage: qwen3_moe_reference.py CHECKPOINT_DIR OUT_JSON TOKEN[,TOKEN...]

Reads config.json and model.safetensors, runs the whole prompt at once the way Hugging Face's
modeling_qwen3_moe.py does (rotate_half RoPE on cat(freqs, freqs), q_norm/k_norm before RoPE,
repeat_kv GQA, softmax router, top-k, optional renormalization, SwiGLU experts), and writes the
last token's logits as a JSON list. qwen3_moe_test compares the C++ decoder against it.
"""

import json
import math
import struct
import sys


def load_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (header_len,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + header_len])
    base = 8 + header_len
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        raw = blob[base + begin:base + end]
        dtype = entry["dtype"]
        if dtype == "F32":
            values = list(struct.unpack("<%df" % (len(raw) // 4), raw))
        elif dtype == "F16":
            values = list(struct.unpack("<%de" % (len(raw) // 2), raw))
        elif dtype == "BF16":
            halves = struct.unpack("<%dH" % (len(raw) // 2), raw)
            values = [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in halves]
        else:
            raise ValueError("unsupported dtype " + dtype)
        tensors[name] = (entry["shape"], values)
    return tensors


def linear(weight, x):
    """weight: ([out, in], flat values); x: list of `in` floats."""
    (rows, cols), w = weight
    return [math.fsum(w[r * cols + c] * x[c] for c in range(cols)) for r in range(rows)]


def rms_norm(x, weight, eps):
    variance = math.fsum(v * v for v in x) / len(x)
    inv = 1.0 / math.sqrt(variance + eps)
    return [weight[1][i] * (x[i] * inv) for i in range(len(x))]


def rotate_half(x):
    half = len(x) // 2
    return [-v for v in x[half:]] + x[:half]


def rope(x, position, head_dim, theta):
    freqs = [position / theta ** (i / head_dim) for i in range(0, head_dim, 2)]
    emb = freqs + freqs
    rotated = rotate_half(x)
    return [x[i] * math.cos(emb[i]) + rotated[i] * math.sin(emb[i]) for i in range(head_dim)]


def softmax(x):
    top = max(x)
    e = [math.exp(v - top) for v in x]
    total = math.fsum(e)
    return [v / total for v in e]


def silu(v):
    return v / (1.0 + math.exp(-v))


def mlp(t, prefix, h):
    """A SwiGLU MLP: prefix + gate_proj / up_proj / down_proj."""
    gate = linear(t[prefix + "gate_proj.weight"], h)
    up = linear(t[prefix + "up_proj.weight"], h)
    return linear(t[prefix + "down_proj.weight"], [silu(g) * u for g, u in zip(gate, up)])


def routed_experts(cfg, t, p, h, norm_topk_default):
    """Softmax router p + gate, top-k, optional renormalization, experts summed by index."""
    probs = softmax(linear(t[p + "gate.weight"], h))
    chosen = sorted(range(len(probs)), key=lambda e: (-probs[e], e))[:cfg["num_experts_per_tok"]]
    weights = {e: probs[e] for e in chosen}
    if cfg.get("norm_topk_prob", norm_topk_default):
        total = sum(weights.values())
        weights = {e: w / total for e, w in weights.items()}
    out = [0.0] * len(h)
    for e in sorted(chosen):
        down = mlp(t, p + "experts.%d." % e, h)
        out = [out[i] + down[i] * weights[e] for i in range(len(h))]
    return out


def forward(cfg, t, tokens):
    hidden, heads, kv_heads = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    group = heads // kv_heads
    embed = t["model.embed_tokens.weight"][1]
    xs = [embed[tok * hidden:(tok + 1) * hidden] for tok in tokens]
    for layer in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % layer
        keys, values, queries = [], [], []
        for pos, x in enumerate(xs):
            h = rms_norm(x, t[p + "input_layernorm.weight"], eps)
            q = linear(t[p + "self_attn.q_proj.weight"], h)
            k = linear(t[p + "self_attn.k_proj.weight"], h)
            v = linear(t[p + "self_attn.v_proj.weight"], h)
            q_heads = [rope(rms_norm(q[i * head_dim:(i + 1) * head_dim], t[p + "self_attn.q_norm.weight"], eps),
                            pos, head_dim, theta) for i in range(heads)]
            k_heads = [rope(rms_norm(k[i * head_dim:(i + 1) * head_dim], t[p + "self_attn.k_norm.weight"], eps),
                            pos, head_dim, theta) for i in range(kv_heads)]
            v_heads = [v[i * head_dim:(i + 1) * head_dim] for i in range(kv_heads)]
            queries.append(q_heads)
            keys.append(k_heads)
            values.append(v_heads)
        new_xs = []
        for pos, x in enumerate(xs):
            attn = []
            for head in range(heads):
                kvh = head // group  # repeat_kv: query head h reads kv head h // group
                scores = [math.fsum(a * b for a, b in zip(queries[pos][head], keys[j][kvh])) / math.sqrt(head_dim)
                          for j in range(pos + 1)]
                probs = softmax(scores)
                attn += [math.fsum(probs[j] * values[j][kvh][d] for j in range(pos + 1)) for d in range(head_dim)]
            o = linear(t[p + "self_attn.o_proj.weight"], attn)
            x = [x[i] + o[i] for i in range(hidden)]
            h = rms_norm(x, t[p + "post_attention_layernorm.weight"], eps)
            out = routed_experts(cfg, t, p + "mlp.", h, norm_topk_default=False)
            new_xs.append([x[i] + out[i] for i in range(hidden)])
        xs = new_xs
    h = rms_norm(xs[-1], t["model.norm.weight"], eps)
    head = t["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else t["lm_head.weight"]
    return linear(head, h)


def run(argv, forward_fn, usage):
    """Reads CHECKPOINT_DIR OUT_JSON TOKENS from argv and writes forward_fn's logits."""
    if len(argv) != 3:
        sys.exit(usage)
    checkpoint, out_path, token_text = argv
    with open(checkpoint + "/config.json") as f:
        cfg = json.load(f)
    tensors = load_safetensors(checkpoint + "/model.safetensors")
    tokens = [int(v) for v in token_text.split(",")]
    logits = forward_fn(cfg, tensors, tokens)
    with open(out_path, "w") as f:
        json.dump(logits, f)
    return 0


def main(argv):
    return run(argv, forward, __doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
