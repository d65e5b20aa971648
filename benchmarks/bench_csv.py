"""Loading large trace CSVs: wall time and peak memory of ``Trace.from_csv``.

Writes a CSV of ``--rows`` requests (default 10,000,000: arrival, prompt_len, output_len; about
170 MB), then loads it in a fresh process with pyarrow's reader (``flowgym[fastcsv]``) and, for
reference, a 1,000,000-row prefix with the csv module (the path taken without pyarrow, and for
any file with a bad value, to name its row). Prints each load's wall time and peak RSS (the
process's maximum resident set, less the interpreter's before the load; pyarrow is imported
before both are taken, so its import is not charged to the reader).

    python benchmarks/bench_csv.py [--rows 10000000]

Goal (issue: hardening): 10M rows in <= 10 s with <= 2 GB peak.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile

import numpy as np
from _args import at_least

LOAD = r"""
import resource, sys, time
import flowgym.sim.workloads as wl
if sys.argv[2] == "csv":
    wl._csv_columns_arrow = lambda *a: None
else:  # imported before the clock starts: the reader's time, not the library's import (0.2 s, 40 MiB)
    import pyarrow.csv
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
tr = wl.Trace.from_csv(sys.argv[1])
wall = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
print(f"{len(tr)} {wall:.2f} {peak / 1024:.0f}")
"""


def write_csv(path: str, rows: int) -> None:
    rng = np.random.default_rng(0)
    with open(path, "w") as fh:
        fh.write("arrival,prompt_len,output_len\n")
        step = 1_000_000
        start = 0
        for lo in range(0, rows, step):
            n = min(step, rows - lo)
            a = start + np.cumsum(rng.integers(0, 3, n))
            start = int(a[-1])
            block = np.stack([a, rng.integers(1, 2000, n), rng.integers(1, 1000, n)], axis=1)
            np.savetxt(fh, block, fmt="%d", delimiter=",")


def load(path: str, how: str) -> tuple[int, float, float]:
    out = subprocess.run([sys.executable, "-c", LOAD, path, how], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"loading with {how} failed:\n{out.stderr.strip()}")
    n, wall, peak = out.stdout.split()
    return int(n), float(wall), float(peak)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=at_least(1), default=10_000_000)
    args = ap.parse_args()
    if importlib.util.find_spec("pyarrow") is None:
        ap.error("this benchmark times pyarrow's reader, which is not installed: pip install -e '.[fastcsv]'")
    with tempfile.TemporaryDirectory() as tmp:
        big = os.path.join(tmp, "big.csv")
        write_csv(big, args.rows)
        small = os.path.join(tmp, "small.csv")
        with open(big) as src, open(small, "w") as dst:
            for i, line in enumerate(src):
                if i > min(args.rows, 1_000_000):
                    break
                dst.write(line)
        size = os.path.getsize(big) / 2**20
        n, wall, peak = load(big, "arrow")
        print(f"pyarrow reader: {n:,} rows ({size:.0f} MiB) in {wall:.2f} s, peak +{peak:.0f} MiB")
        n1, wall1, peak1 = load(small, "csv")
        print(f"csv module:     {n1:,} rows in {wall1:.2f} s, peak +{peak1:.0f} MiB "
              f"(x{n / n1:.0f} rows would take about {wall1 * n / n1:.0f} s)")
        n2, wall2, _ = load(small, "arrow")
        print(f"pyarrow reader: {n2:,} rows in {wall2:.2f} s ({wall1 / wall2:.1f}x the csv module on the same file)")


if __name__ == "__main__":
    main()
