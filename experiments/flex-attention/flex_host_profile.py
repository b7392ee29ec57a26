"""Where the host time of a kiln-compiled FlexAttention training step goes (issue 28): at
B4 H16 L1024 D64 bf16 causal the step's kernels take 0.30 ms on an H200 and the step 1.25 ms
(torch.compile: 0.18 and 0.73; flex_train_sweep.py). cProfile over many steps, kiln and then
torch.compile, the top functions by own time and by cumulative time.

    python experiments/flex-attention/flex_host_profile.py [--L 1024 --steps 300]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats

import kiln
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention


def causal(b, h, m, n):
    return m >= n


def attend(q, k, v, block_mask):
    return flex_attention(q, k, v, block_mask=block_mask)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--L", type=int, default=1024)
    p.add_argument("--steps", type=int, default=300)
    a = p.parse_args()
    bm = create_block_mask(causal, 1, 1, a.L, a.L, device="cuda", BLOCK_SIZE=128)
    q, k, v = (torch.randn(4, 16, a.L, 64, device="cuda", dtype=torch.bfloat16).requires_grad_()
               for _ in range(3))
    grad = torch.randn(4, 16, a.L, 64, device="cuda", dtype=torch.bfloat16)
    for name, fn in (("kiln", kiln.compile(attend, fullgraph=True)),
                     ("torch_compile", torch.compile(attend, fullgraph=True))):
        def step(fn=fn):
            out = fn(q, k, v, bm)
            q.grad = k.grad = v.grad = None
            out.backward(grad)

        for _ in range(10):
            step()
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(a.steps):
            step()
        torch.cuda.synchronize()
        prof.disable()
        for key, n in (("tottime", 35), ("cumtime", 45)):
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats(key).print_stats(n)
            print(f"===== {name} by {key} ({a.steps} steps)")
            print("\n".join(ln for ln in s.getvalue().splitlines() if ln.strip())[:9000])
        if name == "torch_compile":
            break


if __name__ == "__main__":
    main()
