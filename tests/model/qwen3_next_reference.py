#!/usr/bin/env python3
"""An independent float64 reference of the Qwen3-Next (hybrid) forward pass, standard library only.

Usage: qwen3_next_reference.py CHECKPOINT_DIR OUT_JSON TOKEN[,TOKEN...]

Written from Hugging Face's modeling_qwen3_next.py, whole sequence at once: Qwen3NextRMSNorm's
(1 + weight) scale, fix_query_key_value_ordering's per-key-head [q | k | v | z] and [b | a]
views, the causal conv1d as F.conv1d with kernel - 1 zeros of left padding then SiLU,
repeat_interleave of q and k over value heads, l2norm(eps 1e-6), q * head_dim ** -0.5, the gated
delta rule in its recurrent form, Qwen3NextRMSNormGated(o, z), gated attention (q_proj as
[query | gate] per head, partial rotary, output * sigmoid(gate)), and the MoE plus the shared
expert scaled by sigmoid(shared_expert_gate). Writes the last token's logits as a JSON list;
qwen3_next_test compares the C++ decoder against it.
"""

import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qwen3_moe_reference import (linear, mlp, rotate_half, routed_experts, run,  # noqa: E402
                                 silu, softmax)


def centered_rms_norm(x, weight, eps):
    inv = 1.0 / math.sqrt(math.fsum(v * v for v in x) / len(x) + eps)
    return [(x[i] * inv) * (1.0 + weight[1][i]) for i in range(len(x))]


def gated_rms_norm(x, gate, weight, eps):
    inv = 1.0 / math.sqrt(math.fsum(v * v for v in x) / len(x) + eps)
    return [weight[1][i] * (x[i] * inv) * silu(gate[i]) for i in range(len(x))]


def l2norm(x, eps=1e-6):
    inv = 1.0 / math.sqrt(math.fsum(v * v for v in x) + eps)
    return [v * inv for v in x]


def sigmoid(v):
    return 1.0 / (1.0 + math.exp(-v))


def softplus(v):
    return v if v > 20.0 else math.log1p(math.exp(v))


def partial_rope(x, position, rotary_dim, theta):
    freqs = [position / theta ** (i / rotary_dim) for i in range(0, rotary_dim, 2)]
    emb = freqs + freqs
    rot = x[:rotary_dim]
    rotated = rotate_half(rot)
    out = [rot[i] * math.cos(emb[i]) + rotated[i] * math.sin(emb[i]) for i in range(rotary_dim)]
    return out + x[rotary_dim:]


def linear_attention(cfg, t, p, hs):
    eps = cfg["rms_norm_eps"]
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    hk, hv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    kernel = cfg["linear_conv_kernel_dim"]
    r = nv // nk
    width = 2 * hk + 2 * r * hv
    mixed, zs, bs, as_ = [], [], [], []
    for h in hs:
        qkvz = linear(t[p + "in_proj_qkvz.weight"], h)
        ba = linear(t[p + "in_proj_ba.weight"], h)
        q, k, v, z, b, a = [], [], [], [], [], []
        for g in range(nk):
            grp = qkvz[g * width:(g + 1) * width]
            q += grp[:hk]
            k += grp[hk:2 * hk]
            v += grp[2 * hk:2 * hk + r * hv]
            z += grp[2 * hk + r * hv:]
            b += ba[g * 2 * r:g * 2 * r + r]
            a += ba[g * 2 * r + r:(g + 1) * 2 * r]
        mixed.append(q + k + v)
        zs.append(z)
        bs.append(b)
        as_.append(a)
    # conv1d(groups=channels, padding=kernel-1)[..., :seq_len], then SiLU.
    (channels, _, _), w = t[p + "conv1d.weight"]
    n = len(hs)
    conv = [[0.0] * channels for _ in range(n)]
    for c in range(channels):
        padded = [0.0] * (kernel - 1) + [mixed[s][c] for s in range(n)]
        for s in range(n):
            conv[s][c] = silu(math.fsum(w[c * kernel + j] * padded[s + j] for j in range(kernel)))
    key_dim = nk * hk
    a_log, dt_bias = t[p + "A_log"][1], t[p + "dt_bias"][1]
    states = [[[0.0] * hv for _ in range(hk)] for _ in range(nv)]
    outs = []
    for s in range(n):
        q_all, k_all, v_all = conv[s][:key_dim], conv[s][key_dim:2 * key_dim], conv[s][2 * key_dim:]
        core = []
        for h in range(nv):
            kh = h // r  # repeat_interleave over value heads
            q = [x * hk ** -0.5 for x in l2norm(q_all[kh * hk:(kh + 1) * hk])]
            k = l2norm(k_all[kh * hk:(kh + 1) * hk])
            v = v_all[h * hv:(h + 1) * hv]
            beta = sigmoid(bs[s][h])
            g = -math.exp(a_log[h]) * softplus(as_[s][h] + dt_bias[h])
            S = states[h]
            decay = math.exp(g)
            for i in range(hk):
                S[i] = [x * decay for x in S[i]]
            kv_mem = [math.fsum(S[i][j] * k[i] for i in range(hk)) for j in range(hv)]
            delta = [(v[j] - kv_mem[j]) * beta for j in range(hv)]
            for i in range(hk):
                S[i] = [S[i][j] + k[i] * delta[j] for j in range(hv)]
            o = [math.fsum(S[i][j] * q[i] for i in range(hk)) for j in range(hv)]
            core += gated_rms_norm(o, zs[s][h * hv:(h + 1) * hv], t[p + "norm.weight"], eps)
        outs.append(linear(t[p + "out_proj.weight"], core))
    return outs


def full_attention(cfg, t, p, hs):
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    heads, kv_heads, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    rotary = int(hd * cfg.get("partial_rotary_factor", 0.25))
    group = heads // kv_heads
    queries, gates, keys, values = [], [], [], []
    for pos, h in enumerate(hs):
        qg = linear(t[p + "q_proj.weight"], h)
        k = linear(t[p + "k_proj.weight"], h)
        v = linear(t[p + "v_proj.weight"], h)
        queries.append([partial_rope(centered_rms_norm(qg[i * 2 * hd:i * 2 * hd + hd],
                                                       t[p + "q_norm.weight"], eps),
                                     pos, rotary, theta) for i in range(heads)])
        gates.append([qg[i * 2 * hd + hd:(i + 1) * 2 * hd] for i in range(heads)])
        keys.append([partial_rope(centered_rms_norm(k[i * hd:(i + 1) * hd], t[p + "k_norm.weight"],
                                                    eps), pos, rotary, theta)
                     for i in range(kv_heads)])
        values.append([v[i * hd:(i + 1) * hd] for i in range(kv_heads)])
    outs = []
    for pos in range(len(hs)):
        attn = []
        for head in range(heads):
            kvh = head // group
            scores = [math.fsum(a * b for a, b in zip(queries[pos][head], keys[j][kvh])) / math.sqrt(hd)
                      for j in range(pos + 1)]
            probs = softmax(scores)
            out = [math.fsum(probs[j] * values[j][kvh][d] for j in range(pos + 1)) for d in range(hd)]
            attn += [o * sigmoid(g) for o, g in zip(out, gates[pos][head])]
        outs.append(linear(t[p + "o_proj.weight"], attn))
    return outs


def moe(cfg, t, p, h):
    out = routed_experts(cfg, t, p, h, norm_topk_default=True)
    shared = mlp(t, p + "shared_expert.", h)
    scale = sigmoid(linear(t[p + "shared_expert_gate.weight"], h)[0])
    return [out[i] + scale * shared[i] for i in range(len(h))]


def layer_types(cfg):
    if cfg.get("layer_types"):
        return cfg["layer_types"]
    interval = cfg.get("full_attention_interval", 4)
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
            for i in range(cfg["num_hidden_layers"])]


def forward(cfg, t, tokens):
    hidden, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
    embed = t["model.embed_tokens.weight"][1]
    xs = [embed[tok * hidden:(tok + 1) * hidden] for tok in tokens]
    for layer, kind in enumerate(layer_types(cfg)):
        p = "model.layers.%d." % layer
        hs = [centered_rms_norm(x, t[p + "input_layernorm.weight"], eps) for x in xs]
        if kind == "linear_attention":
            mixed = linear_attention(cfg, t, p + "linear_attn.", hs)
        else:
            mixed = full_attention(cfg, t, p + "self_attn.", hs)
        xs = [[x[i] + m[i] for i in range(hidden)] for x, m in zip(xs, mixed)]
        new_xs = []
        for x in xs:
            h = centered_rms_norm(x, t[p + "post_attention_layernorm.weight"], eps)
            out = moe(cfg, t, p + "mlp.", h)
            new_xs.append([x[i] + out[i] for i in range(hidden)])
        xs = new_xs
    h = centered_rms_norm(xs[-1], t["model.norm.weight"], eps)
    head = t["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else t["lm_head.weight"]
    return linear(head, h)


def main(argv):
    return run(argv, forward, __doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
