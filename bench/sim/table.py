#!/usr/bin/env python3
"""Turns `headroom sim --json` output into the Markdown tables of BENCHMARKS.md.

`table.py RUN.json` prints one run's table; `table.py --seeds RUN.json...` the spread of
warm headroom over runs with different seeds.

Per trace and machine: the lower bound, headroom (cold and warm) against it, OOM events, the
jobs warm headroom killed itself and the work they lost, the best baseline that had no OOM event, and the clairvoyant reference (never a baseline). A target is met when headroom has zero OOM events,
finishes within 1.10x of the lower bound and is at least as fast as every zero-OOM baseline.
"""
import json
import statistics
import sys

CLAIRVOYANT = "clairvoyant greedy (reference)"


def best_zero_oom_baseline(outcomes):
    safe = [o for o in outcomes
            if o["family"] not in ("headroom", "reference") and o["oom_events"] == 0 and o["stalled"] is None]
    return min(safe, key=lambda o: o["makespan"]) if safe else None


def missed_targets(warm, bound, best):
    """The targets a finished warm run missed, as words (none: it met them all)."""
    missed = []
    if warm["oom_events"] > 0:
        missed.append("OOM")
    if warm["makespan"] > 1.10 * bound:
        missed.append(">1.10× bound")
    if best is not None and warm["makespan"] > best["makespan"] * (1 + 1e-9):
        missed.append("slower than " + best["policy"])
    return missed


def seeds(paths):
    """Per trace and machine: warm headroom's median and range over the runs, and in how many
    runs it met every target."""
    rows = {}
    for path in paths:
        with open(path) as file:
            for comparison in json.load(file):
                bound = comparison["lower_bound"]["seconds"]
                by_name = {outcome["policy"]: outcome for outcome in comparison["outcomes"]}
                warm = by_name["headroom (warm)"]
                best = best_zero_oom_baseline(comparison["outcomes"])
                versus = warm["makespan"] / best["makespan"] if best else float("nan")
                key = (comparison["trace"], comparison["machine"])
                met = warm["stalled"] is None and not missed_targets(warm, bound, best)
                rows.setdefault(key, []).append((warm["makespan"] / bound, versus, met))
    print("| trace | machine | warm ×bound: median [range] | warm ÷ best zero-OOM baseline: median [range] "
          "| runs meeting every target |")
    print("|---|---|---|---|---|")
    for (trace, machine), runs in rows.items():
        def spread(values):
            return f"{statistics.median(values):.3f} [{min(values):.3f}–{max(values):.3f}]"
        met = sum(1 for run in runs if run[2])
        print(f"| {trace} | {machine} | {spread([r[0] for r in runs])} | {spread([r[1] for r in runs])} "
              f"| {met}/{len(runs)} |")


# The terms of the lower bound, as `headroom sim` names them.
BOUND_TERMS = {
    "cpu": "cpu",
    "memory": "memory",
    "critical_path": "critical path",
    "prerequisites_then_chain": "prerequisites then chain",
}


def binding_term(lower_bound):
    """The name of the term that sets the bound."""
    return next(name for key, name in BOUND_TERMS.items()
                if lower_bound[key] == lower_bound["seconds"])


def main(path):
    with open(path) as file:
        comparisons = json.load(file)
    print("| trace | machine | lower bound | headroom cold: ×bound, OOM | headroom warm: ×bound, OOM "
          "| warm: kills, work lost | best zero-OOM baseline | warm ÷ best | clairvoyant: ×bound "
          "| targets (warm) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for comparison in comparisons:
        bound = comparison["lower_bound"]["seconds"]
        outcomes = comparison["outcomes"]
        by_name = {outcome["policy"]: outcome for outcome in outcomes}
        best = best_zero_oom_baseline(outcomes)

        def cell(name):
            outcome = by_name.get(name)
            if outcome is None:
                return "-"
            if outcome["stalled"] is not None:
                return "**stalled**"
            return f'{outcome["makespan"] / bound:.2f}×, {outcome["oom_events"]}'

        warm = by_name.get("headroom (warm)")
        verdict, versus = "-", "-"
        if warm is not None and warm["stalled"] is None:
            missed = missed_targets(warm, bound, best)
            verdict = "met" if not missed else "missed: " + "; ".join(missed)
            if best is not None:
                versus = f'{warm["makespan"] / best["makespan"]:.2f}'
        best_cell = f'{best["policy"]} ({best["makespan"]:.0f} s)' if best else "none"
        kills = "-" if warm is None else f'{warm["policy_kills"]}, {warm["wasted_seconds"]:.0f} s'
        term = binding_term(comparison["lower_bound"])
        print(f'| {comparison["trace"]} | {comparison["machine"]} | {bound:.0f} s ({term}) '
              f'| {cell("headroom (cold)")} | {cell("headroom (warm)")} | {kills} | {best_cell} '
              f'| {versus} | {cell(CLAIRVOYANT).split(",")[0]} | {verdict} |')


if __name__ == "__main__":
    if sys.argv[1] == "--seeds":
        seeds(sys.argv[2:])
    else:
        main(sys.argv[1])
