#!/usr/bin/env python3
"""Recomputes, in float64 PyTorch, the optimizer step that scripts/spike/spike_replay.cpp exported,
and says where the loss spike comes from. See docs/training.md, "Loss spikes".

    /usr/bin/python3 scripts/spike/replay.py OUT        # Debian: apt-get install python3-torch

It prints:
  1. the loss and gradient norm before the step, in float64, against tide's;
  2. AdamW's step in float64 from the same parameters, moments and gradients, and its largest
     difference from tide's parameters after the step (the optimizer computes what AdamW does);
  3. the loss after the step on the step's own batch and on the next one, float64, on tide's
     parameters and on float64's own (the spike is there in exact arithmetic, or it is not);
  4. the loss along the step, p_before + a (p_after - p_before), a from 0 to 1;
  5. the tensors that, moved alone, raise the loss most, and, for an attention's qkv weight, which
     of its q, k and v rows;
  6. in block 0: the norm of the token's embedding and of the attention's output, before and after.
The model is tests/golden/gpt_reference.py's, the golden files' GPT-2.
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "golden"))
from gpt_reference import forward as gpt_forward  # noqa: E402


def read_meta(path):
    meta = {}
    for line in open(path):
        k, v = line.split()
        meta[k] = float(v)
    return meta


def main():
    out = sys.argv[1]
    meta = read_meta(os.path.join(out, "meta"))
    L, NH, C, V = (int(meta[k]) for k in ("layers", "heads", "channels", "vocab"))
    B, T, step = int(meta["batch"]), int(meta["seq"]), int(meta["step"])
    block = [("ln1.w", (C,)), ("ln1.b", (C,)), ("attn.qkv.w", (3 * C, C)), ("attn.qkv.b", (3 * C,)),
             ("attn.proj.w", (C, C)), ("attn.proj.b", (C,)), ("ln2.w", (C,)), ("ln2.b", (C,)),
             ("mlp.fc.w", (4 * C, C)), ("mlp.fc.b", (4 * C,)), ("mlp.proj.w", (C, 4 * C)), ("mlp.proj.b", (C,))]
    shapes = {"wte": (V, C), "wpe": (T, C)}
    for l in range(L):
        shapes.update({f"h{l}.{n}": s for n, s in block})
    shapes.update({"lnf.w": (C,), "lnf.b": (C,)})
    names = list(shapes)

    def load(side, kind):
        def one(n):
            raw = open(os.path.join(out, side, f"{kind}_{n}"), "rb").read()
            return torch.frombuffer(bytearray(raw), dtype=torch.float32).reshape(shapes[n]).double()
        return {n: one(n) for n in names}

    raw = open(os.path.join(out, "batches"), "rb").read()
    tokens = torch.frombuffer(bytearray(raw), dtype=torch.int32).reshape(2, 2, B, T).long()
    (x_in, x_tg), (n_in, n_tg) = (tokens[0][0], tokens[0][1]), (tokens[1][0], tokens[1][1])

    def forward(p, tok, probe=None):
        return gpt_forward(p, tok, L, NH, probe)

    def loss(p, tok, tg):
        return torch.nn.functional.cross_entropy(forward(p, tok).reshape(-1, V), tg.reshape(-1))

    before, m0, v0, after = load("before", "p"), load("before", "m"), load("before", "v"), load("after", "p")

    # 1. Loss and gradients before the step.
    p = {n: t.clone().requires_grad_(True) for n, t in before.items()}
    l0 = loss(p, x_in, x_tg)
    l0.backward()
    g = {n: t.grad for n, t in p.items()}
    norm = math.sqrt(sum(float((t * t).sum()) for t in g.values()))
    print(f"step {step}: loss before it {l0.item():.4f} (tide {meta['loss_before']:.4f}), gradient norm {norm:.4f}")

    # 2. AdamW in float64 (torch.optim.AdamW's rule: decoupled decay, bias-corrected moments),
    #    no decay on vectors (decay_matrices_only), the gradients clipped as tide clips them.
    lr, b1, b2, eps, wd, clip = (meta[k] for k in ("lr", "beta1", "beta2", "eps", "weight_decay", "clip"))
    scale = min(1.0, clip / (norm + 1e-6)) if clip > 0 else 1.0
    own, worst = {}, 0.0
    for n in names:
        gn = g[n] * scale
        m = b1 * m0[n] + (1 - b1) * gn
        v = b2 * v0[n] + (1 - b2) * gn * gn
        upd = (m / (1 - b1 ** step)) / ((v / (1 - b2 ** step)).sqrt() + eps)
        own[n] = before[n] - lr * (upd + (wd if len(shapes[n]) == 2 else 0.0) * before[n])
        worst = max(worst, float((own[n] - after[n]).abs().max()))
    largest = max(float((after[n] - before[n]).abs().max()) for n in names)
    print(f"AdamW in float64 vs tide's parameters after the step: largest difference {worst:.2e} "
          f"(largest move of one element {largest:.2e}, lr {lr:.3e})")

    # 3. The loss after the step, exact arithmetic.
    with torch.no_grad():
        for what, tok, tg in (("the step's own batch", x_in, x_tg), ("the next batch", n_in, n_tg)):
            print(f"after the step, on {what}: {loss(after, tok, tg).item():.4f} on tide's parameters, "
                  f"{loss(own, tok, tg).item():.4f} on float64's own")
        print(f"(tide's loss of the next step: {meta['loss_next']:.4f})")

        # 4. Along the step.
        line = []
        for a in (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0):
            q = {n: before[n] + a * (after[n] - before[n]) for n in names}
            line.append(f"{a:.2f}: {loss(q, x_in, x_tg).item():.4f}")
        print("the loss on the step's batch along the step, before + a (after - before):\n  " + ", ".join(line))

        # 5. One tensor at a time.
        alone = []
        for n in names:
            q = dict(before)
            q[n] = after[n]
            alone.append((loss(q, x_in, x_tg).item(), n))
        alone.sort(reverse=True)
        print("moved alone, the tensors that raise the loss most: " +
              ", ".join(f"{n} {l:.4f}" for l, n in alone[:4]))
        top = alone[0][1]
        if top.endswith("attn.qkv.w"):
            parts = []
            for part, rows in (("q", slice(0, C)), ("k", slice(C, 2 * C)), ("v", slice(2 * C, 3 * C))):
                q = dict(before)
                q[top] = before[top].clone()
                q[top][rows] = after[top][rows]
                parts.append(f"{part} rows {loss(q, x_in, x_tg).item():.4f}")
            print(f"  {top}, its rows moved alone: " + ", ".join(parts))

        # 6. Block 0's residual stream.
        for side, q in (("before", before), ("after", after)):
            probe = {}
            forward(q, x_in, probe)
            e, y = probe["embedding"], probe["attention"]
            print(f"block 0 {side}: |embedding| {e[:, 1:].mean():.3f}, |attention output| at position 0 "
                  f"{y[:, 0].mean():.3f}, after it {y[:, 1:].mean():.3f}")


if __name__ == "__main__":
    main()
