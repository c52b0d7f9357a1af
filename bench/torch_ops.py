#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# PyTorch's numbers for the shapes `depot-bench ops` measures (fp32, rows of 256, the same
# sizes), timed the same way: CUDA events, warm-up, median. Writes JSON for compare_ops.py.
# Usage: torch_ops.py --size BYTES --repetitions N --json OUT
import argparse
import json
import statistics

import torch


def median_ms(fn, reps, warmup=2):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--repetitions", type=int, default=10)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", required=True)
    args = p.parse_args()
    torch.manual_seed(args.seed)
    rows = []
    sizes = []
    b = 4 << 10
    while b <= args.size:
        sizes.append(b)
        b *= 16
    if not sizes or sizes[-1] != args.size:
        sizes.append(args.size)
    for nbytes in sizes:
        n = nbytes // 4
        r = max(n // 256, 1)
        nn = r * 256
        a = (torch.arange(nn, device="cuda") % 1000).float().mul_(0.5).view(r, 256)
        out = torch.empty_like(a)
        idx = torch.randint(0, r, (r,), device="cuda")
        mask = torch.randint(0, 2, (nn,), device="cuda", dtype=torch.bool)
        sel = int(mask.sum())
        flat = a.view(-1)
        moved = nn * 4
        ops = {
            "fill": (lambda: out.fill_(1.5), moved),
            "copy contiguous": (lambda: out.copy_(a), 2 * moved),
            "copy transpose (R x 256)": (lambda: a.t().contiguous(), 2 * moved),
            "gather rows (random)": (lambda: torch.index_select(a, 0, idx, out=out), 2 * moved),
            "scatter-add rows (random)": (lambda: out.index_add_(0, idx, a), 3 * moved),
            "masked_select (half)": (lambda: torch.masked_select(flat, mask), moved / 4 + moved + sel * 4),
        }
        for name, (fn, mv) in ops.items():
            ms = median_ms(fn, args.repetitions)
            rows.append({"operation": name, "bytes": moved, "median_ms": ms, "gbps": mv / (ms * 1e6)})
    with open(args.json, "w") as f:
        json.dump({"tool": "torch_ops.py", "torch": torch.__version__, "results": rows}, f, indent=1)


if __name__ == "__main__":
    main()
