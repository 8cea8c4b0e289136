"""Whether a translation unit's size after preprocessing predicts its compiler's peak, on the
real torch-ext build (issue 39's first candidate for cold predictions).

For each compile of the Makefile next to this script it runs the same g++ command with `-E`
instead of `-c`, and counts the bytes and lines the compiler proper would read. It sets them
against the peak each unit had in the recorded build (`traces/recorded/torch-ext.json`) and
prints, for the preprocessed size and for the source file's own size:
  - Pearson's r and Spearman's rank correlation with the peak;
  - how far a peak predicted from one other unit lands from the real one, over every pair of
    units: that unit's peak as it is (what cold headroom borrows from the first job of a
    group to finish) against that peak scaled by the ratio of the two sizes; the median
    error, and the worst underestimate, the side that runs a machine out of memory;
  - the same for a line fitted to the other 45 units (leave-one-out), which needs a history
    of the group that a cold build does not have.

Usage: python3 bench/sim/torch-ext/preprocessed.py SRC TORCH   (see fetch.sh; needs g++, make)
"""
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
TRACE = os.path.join(HERE, "..", "..", "..", "traces", "recorded", "torch-ext.json")


def compile_commands(src, torch):
    """The Makefile's compile commands, as `make -n` prints them."""
    dry_run = subprocess.run(
        ["make", "-f", os.path.join(HERE, "Makefile"), "-n", f"SRC={src}", f"TORCH={torch}",
         "BUILD=build", "all"],
        check=True, capture_output=True, text=True).stdout
    return [shlex.split(line) for line in dry_run.splitlines() if " -c " in line]


def preprocessed(command):
    """(object label, source bytes, preprocessed bytes, preprocessed lines, seconds) of one
    compile."""
    source = command[command.index("-c") + 1]
    label = os.path.basename(command[command.index("-o") + 1])
    argv = [arg for arg in command if arg not in ("-c", "-g")]
    output = argv.index("-o")
    del argv[output:output + 2]
    start = time.perf_counter()
    text = subprocess.run(argv + ["-E"], check=True, capture_output=True).stdout
    seconds = time.perf_counter() - start
    return label, os.path.getsize(source), len(text), text.count(b"\n"), seconds


def ranks(values):
    order = sorted(range(len(values)), key=values.__getitem__)
    result = [0.0] * len(values)
    for rank, index in enumerate(order):
        result[index] = float(rank)
    return result


def from_one_other(sizes, peaks):
    """Signed relative errors of each unit's peak predicted from each other unit's, scaled by
    the ratio of their sizes (no sizes: as it is)."""
    return [(peaks[j] * (sizes[i] / sizes[j] if sizes else 1.0) - peaks[i]) / peaks[i]
            for i in range(len(peaks)) for j in range(len(peaks)) if i != j]


def leave_one_out(sizes, peaks):
    """Signed relative errors of each unit's peak predicted by a line fitted to the others."""
    errors = []
    for i in range(len(peaks)):
        xs = sizes[:i] + sizes[i + 1:]
        ys = peaks[:i] + peaks[i + 1:]
        slope, intercept = statistics.linear_regression(xs, ys)
        errors.append((intercept + slope * sizes[i] - peaks[i]) / peaks[i])
    return errors


def summary(errors):
    """The median error and the worst underestimate, as table cells."""
    median = statistics.median(abs(e) for e in errors)
    return f"{median:.1%}, {min(min(errors), 0.0):+.1%}"


def main():
    src, torch = sys.argv[1], sys.argv[2]
    trace = json.load(open(TRACE))
    compiles = {job["label"]: job for job in trace["jobs"] if job["kind"] == "compile"}
    peaks = {label: job["peak"] for label, job in compiles.items()}
    with ThreadPoolExecutor(max_workers=os.cpu_count()) as pool:
        units = list(pool.map(preprocessed, compile_commands(src, torch)))
    units = [unit for unit in units if unit[0] in peaks]
    peak = [float(peaks[label]) for label, *_ in units]
    gib = 1 << 30
    print(f"{len(units)} units; peaks {min(peak) / gib:.2f}–{max(peak) / gib:.2f} GiB; "
          f"preprocessing took {statistics.median(u[4] for u in units):.2f} s a unit (median, "
          f"{os.cpu_count()} at once), compiling "
          f"{statistics.median(compiles[u[0]]['duration'] for u in units):.1f} s in the recording")
    print("| size | range | Pearson r | Spearman ρ | from one other unit: median error, "
          "worst under | line fitted to the others: the same |")
    print("|---|---|---:|---:|---|---|")
    print(f"| none: the other unit's peak as it is | | | | {summary(from_one_other([], peak))} "
          "| |")
    for name, column, unit, scale in (("source file bytes", 1, "KiB", 1 << 10),
                                      ("preprocessed bytes", 2, "MiB", 1 << 20),
                                      ("preprocessed lines", 3, "k lines", 1000)):
        size = [float(u[column]) for u in units]
        r = statistics.correlation(size, peak)
        rho = statistics.correlation(ranks(size), ranks(peak))
        print(f"| {name} | {min(size) / scale:.1f}–{max(size) / scale:.1f} {unit} | {r:.2f} | "
              f"{rho:.2f} | {summary(from_one_other(size, peak))} | "
              f"{summary(leave_one_out(size, peak))} |")


main()
