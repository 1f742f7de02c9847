#!/usr/bin/env python3
"""Writes tests/golden/optim_steps.bin: 5 steps of torch.optim.Adam, AdamW and SGD (three
variants) in float32 on fixed parameters and a fixed sequence of gradients: the golden states
tests/kernels/adam.cpp (Adam and AdamW) and tests/kernels/sgd.cpp compare tide's host kernels
against.

    /usr/bin/python3 tests/golden/make_optim_golden.py    # Debian: apt-get install python3-torch

Everything runs in float32 on the CPU, foreach=False (torch's single-tensor loops), as a float32
training run would. The hyper-parameters are float32 values (0.01 is written as the float
nearest it) and torch is given those same values, so the only differences left between tide
and torch are the order and rounding of the float arithmetic.

Runs, in this order:
    Adam   lr 1e-2, betas (0.9, 0.999), eps 1e-8, weight_decay 0.1 (L2), amsgrad False
    AdamW  lr 1e-2, betas (0.9, 0.999), eps 1e-8, weight_decay 0.1 (decoupled)
    SGD    lr 0.05, momentum 0.9, dampening 0,   weight_decay 0.01, nesterov True
    SGD    lr 0.05, momentum 0.9, dampening 0.1, weight_decay 0.01, nesterov False
    SGD    lr 0.05, momentum 0,   dampening 0,   weight_decay 0.01, nesterov False

File layout (little endian, no padding):
    char[8]  "TIDEOPT1"
    int32    n, steps, runs
    float32  initial parameters (n)
    float32  gradients (steps, n): the gradient of step t (1-based) is row t - 1
    runs times:
      int32    kind: 0 Adam, 1 AdamW, 2 SGD
      float32  lr, h1, h2, h3, weight_decay
               (Adam, AdamW: h1 beta1, h2 beta2, h3 eps; SGD: h1 momentum, h2 dampening, h3 0)
      int32    nesterov (0 or 1), states (how many state arrays follow each step's parameters)
      steps times:
        float32  parameters after the step (n)
        float32  states arrays (n) each: Adam, AdamW: exp_avg, exp_avg_sq; SGD with momentum:
                 momentum_buffer; SGD without momentum: none
"""
import os
import struct

import torch

N, STEPS = 301, 5  # 301: not a whole number of SIMD vectors, so tide's padded tail is covered


def f32(x):
    """The float32 nearest x, as a Python float (what tide's float hyper-parameters hold)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


ADAM = dict(lr=f32(1e-2), betas=(f32(0.9), f32(0.999)), eps=f32(1e-8), weight_decay=f32(0.1))
SGD_LR, SGD_MOMENTUM, SGD_DAMPENING, SGD_WD = f32(0.05), f32(0.9), f32(0.1), f32(0.01)
RUNS = [
    (0, torch.optim.Adam, dict(ADAM, amsgrad=False)),
    (1, torch.optim.AdamW, dict(ADAM, amsgrad=False)),
    (2, torch.optim.SGD, dict(lr=SGD_LR, momentum=SGD_MOMENTUM, dampening=0.0, weight_decay=SGD_WD, nesterov=True)),
    (2, torch.optim.SGD, dict(lr=SGD_LR, momentum=SGD_MOMENTUM, dampening=SGD_DAMPENING, weight_decay=SGD_WD,
                              nesterov=False)),
    (2, torch.optim.SGD, dict(lr=SGD_LR, momentum=0.0, dampening=0.0, weight_decay=SGD_WD, nesterov=False)),
]


def inputs():
    """Parameters in about [-3, 3] and gradients whose magnitudes span three decades per element,
    so Adam's ratio m / sqrt(v) is exercised away from +-1 and weight decay is not negligible."""
    gen = torch.Generator().manual_seed(20240611)
    p0 = torch.randn(N, generator=gen, dtype=torch.float32)
    scale = 10.0 ** (-3.0 * torch.rand(N, generator=gen, dtype=torch.float32))
    grads = torch.randn(STEPS, N, generator=gen, dtype=torch.float32) * scale
    return p0, grads.to(torch.float32)


def run(optimizer, hparams, p0, grads):
    """The parameters and states after each step."""
    p = torch.nn.Parameter(p0.clone())
    opt = optimizer([p], foreach=False, **hparams)
    out = []
    for t in range(STEPS):
        p.grad = grads[t].clone()
        opt.step()
        state = opt.state[p]
        if optimizer is torch.optim.SGD:
            states = [] if hparams["momentum"] == 0 else [state["momentum_buffer"]]
        else:
            states = [state["exp_avg"], state["exp_avg_sq"]]
        out.append([p.detach().clone()] + [s.detach().clone() for s in states])
    return out


def main():
    torch.set_num_threads(1)
    p0, grads = inputs()
    raw = lambda t: t.detach().to(torch.float32).contiguous().numpy().astype("<f4").tobytes()
    out = bytearray(b"TIDEOPT1")
    out += struct.pack("<3i", N, STEPS, len(RUNS))
    out += raw(p0) + raw(grads)
    for kind, optimizer, hp in RUNS:
        steps = run(optimizer, hp, p0, grads)
        if kind == 2:
            h = (hp["momentum"], hp["dampening"], 0.0)
        else:
            h = (hp["betas"][0], hp["betas"][1], hp["eps"])
        out += struct.pack("<i5f2i", kind, hp["lr"], *h, hp["weight_decay"], int(hp.get("nesterov", False)),
                           len(steps[0]) - 1)
        for arrays in steps:
            for a in arrays:
                out += raw(a)
        moved = (steps[-1][0] - p0).abs().max().item()
        print(f"{optimizer.__name__:5} {hp}: max |p5 - p0| = {moved:.4g}")
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "optim_steps.bin")
    with open(path, "wb") as fh:
        fh.write(out)
    print(f"wrote {path}: {len(out)} bytes")


if __name__ == "__main__":
    main()
