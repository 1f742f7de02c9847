#!/usr/bin/env python3
"""Writes tests/golden/gpt_tiny.bin: a fixed tiny GPT-2 in PyTorch (float64 autograd), the
golden state tests/nn/golden.cpp compares tide::nn::gpt against, in the manner of llm.c's
train_gpt2.py debug state.

    /usr/bin/python3 tests/golden/make_golden.py          # Debian: apt-get install python3-torch

The model is GPT-2 (learned positions, pre-LN blocks, GELU tanh, tied LM head over a padded
vocabulary), written out here rather than imported, with tide's parameter names and order. The
parameters are drawn in float32 (so tide loads them exactly) and everything after that runs in
float64: the golden values are the exact answers, rounded once to float32 when written.

File layout (little endian):
    char[8]  "TIDEGPT1"
    int32    layers, heads, channels, vocab, padded_vocab, max_seq, B, T, steps
    float32  lr, beta1, beta2, eps, weight_decay              (torch.optim.AdamW's)
    float32  parameters, tide's order, each tensor row-major, no padding
    int32    tokens (B, T), targets (B, T)
    float32  logits (B, T, Vp), loss, the per-position losses (B, T)
    float32  gradients of the mean loss, same order as the parameters
    float32  losses of `steps` AdamW steps on the same batch (the loss before each step)
"""
import math
import os
import struct

import torch

from gpt_reference import forward as gpt_forward

L, NH, C, V, VP, MAXT = 2, 2, 16, 48, 64, 16
B, T = 2, 8
STEPS = 10
LR, BETA1, BETA2, EPS, WD = 1e-2, 0.9, 0.999, 1e-8, 0.1

BLOCK = [("ln1.w", (C,)), ("ln1.b", (C,)), ("attn.qkv.w", (3 * C, C)), ("attn.qkv.b", (3 * C,)),
         ("attn.proj.w", (C, C)), ("attn.proj.b", (C,)), ("ln2.w", (C,)), ("ln2.b", (C,)),
         ("mlp.fc.w", (4 * C, C)), ("mlp.fc.b", (4 * C,)), ("mlp.proj.w", (C, 4 * C)), ("mlp.proj.b", (C,))]


def parameter_shapes():
    shapes = [("wte", (VP, C)), ("wpe", (MAXT, C))]
    for l in range(L):
        shapes += [(f"h{l}.{name}", shape) for name, shape in BLOCK]
    return shapes + [("lnf.w", (C,)), ("lnf.b", (C,))]


def initial_parameters(gen):
    """GPT-2's init, in float32, with LayerNorm and biases perturbed so no gradient is special."""
    params = {}
    for name, shape in parameter_shapes():
        if name.endswith(".b"):
            p = 0.1 * torch.randn(shape, generator=gen)
        elif "ln" in name:
            p = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        else:
            std = 0.02 / math.sqrt(2 * L) if name.endswith("proj.w") else 0.02
            p = std * torch.randn(shape, generator=gen)
            if name == "wte":
                p[V:] = 0.0  # the padding rows
        params[name] = p.to(torch.float32)
    return params


def forward(p, tokens):
    """Logits (B, T, Vp)."""
    return gpt_forward(p, tokens, L, NH)


def losses_of(logits, targets):
    """Per-position cross-entropy over the V real columns (the padding takes no part)."""
    logp = torch.log_softmax(logits[..., :V], dim=-1)
    return -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def main():
    gen = torch.Generator().manual_seed(1234)
    params32 = initial_parameters(gen)
    tokens = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    targets = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)

    p = {k: v.to(torch.float64).requires_grad_(True) for k, v in params32.items()}
    logits = forward(p, tokens)
    losses = losses_of(logits, targets)
    loss = losses.mean()
    loss.backward()
    grads = {k: v.grad.detach().clone() for k, v in p.items()}

    # AdamW on the same batch, float64; torch.optim.AdamW's decoupled weight decay.
    q = {k: v.to(torch.float64).requires_grad_(True) for k, v in params32.items()}
    opt = torch.optim.AdamW(list(q.values()), lr=LR, betas=(BETA1, BETA2), eps=EPS, weight_decay=WD)
    step_losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        l = losses_of(forward(q, tokens), targets).mean()
        l.backward()
        opt.step()
        step_losses.append(l.item())

    f32 = lambda t: t.detach().to(torch.float32).contiguous().numpy().tobytes()
    out = bytearray(b"TIDEGPT1")
    out += struct.pack("<9i", L, NH, C, V, VP, MAXT, B, T, STEPS)
    out += struct.pack("<5f", LR, BETA1, BETA2, EPS, WD)
    for name, _ in parameter_shapes():
        out += f32(params32[name])
    out += tokens.to(torch.int32).numpy().tobytes() + targets.to(torch.int32).numpy().tobytes()
    out += f32(logits) + struct.pack("<f", loss.item()) + f32(losses)
    for name, _ in parameter_shapes():
        out += f32(grads[name])
    out += struct.pack(f"<{STEPS}f", *step_losses)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpt_tiny.bin")
    with open(path, "wb") as fh:
        fh.write(out)
    print(f"wrote {path}: {len(out)} bytes, loss {loss.item():.6f}, "
          f"AdamW losses {step_losses[0]:.6f} .. {step_losses[-1]:.6f}")


if __name__ == "__main__":
    main()
