#!/usr/bin/env python3
"""The anchor of bench/gpu/gpt2: PyTorch's GPT-2 124M, trained as a user of PyTorch would.

bf16 autocast, F.scaled_dot_product_attention (causal), fused AdamW (lr 3e-4, weight decay 0.1,
tide's settings), B = 8, T = 1024, the same vocabulary (50257) and random tokens; eager, then
torch.compile. One JSON object per variant on stdout:
  {"figure": "torch_gpt2_124m_bf16_tokens_per_s", "compiled": false, "value": ..., ...}
--quick: the bench's quick shape (2 layers, 256 channels, B = 4, T = 256, 3 timed steps).
scripts/gpu-check runs it on the GPU that ran the bench, in the same run.
"""

import argparse
import json
import statistics
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-compile", action="store_true")
    args = ap.parse_args()

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        print(json.dumps({"figure": "torch_gpt2_124m_bf16_tokens_per_s", "error": "no CUDA device"}))
        return 1
    if args.quick:
        layers, heads, channels, batch, seq, steps = 2, 4, 256, 4, 256, 3
    else:
        layers, heads, channels, batch, seq, steps = 12, 12, 768, 8, 1024, 10
    vocab = 50257

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(channels)
            self.qkv = nn.Linear(channels, 3 * channels)
            self.proj = nn.Linear(channels, channels)
            self.ln2 = nn.LayerNorm(channels)
            self.fc = nn.Linear(channels, 4 * channels)
            self.out = nn.Linear(4 * channels, channels)

        def forward(self, x):  # (B, T, C)
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(channels, dim=2)
            q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in (q, k, v))  # (B, NH, T, hs)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
            return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab, channels)
            self.wpe = nn.Embedding(seq, channels)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.lnf = nn.LayerNorm(channels)

        def forward(self, idx, targets):  # (B, T) int64
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            for blk in self.blocks:
                x = blk(x)
            logits = self.lnf(x) @ self.wte.weight.t()  # the tied head, as tide's
            return F.cross_entropy(logits.view(-1, vocab).float(), targets.view(-1))

    device = torch.device("cuda")
    torch.manual_seed(1)
    g = torch.Generator(device="cpu").manual_seed(7)
    idx = torch.randint(0, vocab, (batch, seq), generator=g).to(device)
    tgt = torch.randint(0, vocab, (batch, seq), generator=g).to(device)
    params = None
    variants = [False] if args.no_compile or not hasattr(torch, "compile") else [False, True]
    ok = True
    for compiled in variants:
        model = GPT().to(device)
        params = sum(p.numel() for p in model.parameters())
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
        step_fn = torch.compile(model) if compiled else model
        times, losses = [], []
        try:
            for i in range(steps + 2):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = step_fn(idx, tgt)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                losses.append(loss.item())  # waits for the step, as tide's step returns its loss
                if i >= 2:
                    times.append(time.perf_counter() - t0)
            sec = statistics.median(times)
            print(json.dumps({"figure": "torch_gpt2_124m_bf16_tokens_per_s", "compiled": compiled,
                              "value": batch * seq / sec, "unit": "tokens/s", "seconds_per_step": sec,
                              "params": params, "first_loss": losses[0], "last_loss": losses[-1],
                              "torch": torch.__version__, "device": torch.cuda.get_device_name()}))
        except Exception as e:  # a compile that fails on this machine is reported, not hidden
            ok = False
            print(json.dumps({"figure": "torch_gpt2_124m_bf16_tokens_per_s", "compiled": compiled,
                              "error": f"{type(e).__name__}: {e}"}))
        sys.stdout.flush()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
