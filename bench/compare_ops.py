#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Joins `depot-bench ops --json` and torch_ops.py's JSON (same run, same GPU) into one table:
# depot GB/s, torch GB/s, depot/torch (for masked_select: torch time / depot time).
# Usage: compare_ops.py DEPOT_JSON TORCH_JSON [DEVICE]
import json
import sys


def main():
    depot = json.load(open(sys.argv[1]))
    torch = json.load(open(sys.argv[2]))
    device = sys.argv[3] if len(sys.argv) > 3 else "cuda"
    ours = {}
    for suite in depot["suites"]:
        if suite.get("suite") != "ops":
            continue
        for r in suite["results"]:
            if r["device"] == device:
                ours[(r["operation"], r["bytes"])] = r
    print(f"{'operation':28s} {'size':>12s} {'depot GB/s':>11s} {'torch GB/s':>11s} {'depot/torch':>12s}")
    for t in torch["results"]:
        d = ours.get((t["operation"], t["bytes"]))
        if d is None:
            continue
        ratio = d["gbps"] / t["gbps"] if t["gbps"] > 0 else float("nan")
        print(f"{t['operation']:28s} {t['bytes']:12d} {d['gbps']:11.1f} {t['gbps']:11.1f} {ratio:12.2f}")


if __name__ == "__main__":
    main()
