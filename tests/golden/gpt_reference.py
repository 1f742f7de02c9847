"""GPT-2 as tide::nn::gpt computes it (learned positions, pre-LN blocks, GELU tanh, tied LM head),
written out in PyTorch with tide's parameter names, for the golden files (make_golden.py) and the
replay of a training step (scripts/spike/replay.py). Runs in the parameters' dtype: pass float64
for exact answers."""
import math

import torch


def layernorm(x, w, b):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)  # biased, as GPT-2
    return (x - mean) / torch.sqrt(var + 1e-5) * w + b


def forward(p, tokens, layers, heads, probe=None):
    """Logits (B, T, Vp) of tokens (B, T). probe, a dict, gets block 0's residual stream: the
    norm of the token's embedding and of the attention's output at every position, (B, T) each."""
    Bn, Tn = tokens.shape
    C = p["wte"].shape[1]
    hs = C // heads
    x = p["wte"][tokens] + p["wpe"][:Tn]
    mask = torch.tril(torch.ones(Tn, Tn, dtype=torch.bool))
    for l in range(layers):
        h = lambda name: p[f"h{l}.{name}"]
        qkv = layernorm(x, h("ln1.w"), h("ln1.b")) @ h("attn.qkv.w").T + h("attn.qkv.b")
        q, k, v = qkv.split(C, dim=-1)
        q, k, v = (t.view(Bn, Tn, heads, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = torch.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(Bn, Tn, C) @ h("attn.proj.w").T + h("attn.proj.b")
        if probe is not None and l == 0:
            probe.update(embedding=x.norm(dim=-1), attention=y.norm(dim=-1))
        x = x + y
        f = layernorm(x, h("ln2.w"), h("ln2.b")) @ h("mlp.fc.w").T + h("mlp.fc.b")
        f = torch.nn.functional.gelu(f, approximate="tanh")
        x = x + f @ h("mlp.proj.w").T + h("mlp.proj.b")
    x = layernorm(x, p["lnf.w"], p["lnf.b"])
    return x @ p["wte"].T
