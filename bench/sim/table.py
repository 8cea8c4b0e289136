#!/usr/bin/env python3
"""Turns `headroom sim --json` output into the Markdown tables of BENCHMARKS.md.

`table.py RUN.json` prints one run's table; `table.py --seeds RUN.json...` the spread of
warm headroom over runs with different seeds.

Per trace and machine: the lower bound, headroom (cold and warm) against it, OOM events, the
jobs warm headroom killed itself and the work they lost, the best baseline that had no OOM
event, and the clairvoyant reference (never a baseline), which knows every job's memory curve:
the lower bound is loose, so the fair yardstick is the clairvoyant run. The targets: zero OOM
events cold and warm; warm no slower than every zero-OOM baseline and within 1.05x of the
clairvoyant run; cold within 1.25x of it.
"""
import json
import statistics
import sys

CLAIRVOYANT = "clairvoyant greedy (reference)"


def best_zero_oom_baseline(outcomes):
    safe = [o for o in outcomes
            if o["family"] not in ("headroom", "reference") and o["oom_events"] == 0 and o["stalled"] is None]
    return min(safe, key=lambda o: o["makespan"]) if safe else None


def missed_targets(cold, warm, best, clairvoyant):
    """The targets the finished cold and warm runs missed, as words (none: they met them all)."""
    missed = []
    if warm["oom_events"] > 0 or (cold is not None and cold["oom_events"] > 0):
        missed.append("OOM")
    if best is not None and warm["makespan"] > best["makespan"] * (1 + 1e-9):
        missed.append("warm slower than " + best["policy"])
    if clairvoyant is not None:
        if warm["makespan"] > 1.05 * clairvoyant["makespan"]:
            missed.append("warm >1.05× clairvoyant")
        if cold is not None and cold["makespan"] > 1.25 * clairvoyant["makespan"]:
            missed.append("cold >1.25× clairvoyant")
    return missed


def finished(outcome):
    return outcome if outcome is not None and outcome["stalled"] is None else None


def seeds(paths):
    """Per trace and machine: warm headroom against the best zero-OOM baseline and both runs
    against the clairvoyant one, median and range over the runs, and in how many runs every
    target was met."""
    rows = {}
    for path in paths:
        with open(path) as file:
            for comparison in json.load(file):
                by_name = {outcome["policy"]: outcome for outcome in comparison["outcomes"]}
                cold = finished(by_name.get("headroom (cold)"))
                warm = finished(by_name.get("headroom (warm)"))
                clairvoyant = finished(by_name.get(CLAIRVOYANT))
                best = best_zero_oom_baseline(comparison["outcomes"])
                nan = float("nan")
                versus = warm["makespan"] / best["makespan"] if warm and best else nan
                warm_cv = warm["makespan"] / clairvoyant["makespan"] if warm and clairvoyant else nan
                cold_cv = cold["makespan"] / clairvoyant["makespan"] if cold and clairvoyant else nan
                met = bool(cold and warm) and not missed_targets(cold, warm, best, clairvoyant)
                key = (comparison["trace"], comparison["machine"])
                rows.setdefault(key, []).append((versus, warm_cv, cold_cv, met))
    print("| trace | machine | warm ÷ best zero-OOM baseline | warm ÷ clairvoyant "
          "| cold ÷ clairvoyant | runs meeting every target |")
    print("|---|---|---|---|---|---|")
    for (trace, machine), runs in rows.items():
        def spread(values):
            return f"{statistics.median(values):.3f} [{min(values):.3f}–{max(values):.3f}]"
        met = sum(1 for run in runs if run[3])
        print(f"| {trace} | {machine} | {spread([r[0] for r in runs])} | {spread([r[1] for r in runs])} "
              f"| {spread([r[2] for r in runs])} | {met}/{len(runs)} |")


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
          "| cold ÷ clairvoyant | warm ÷ clairvoyant | targets |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
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

        cold = finished(by_name.get("headroom (cold)"))
        warm = finished(by_name.get("headroom (warm)"))
        clairvoyant = finished(by_name.get(CLAIRVOYANT))

        def against_clairvoyant(run):
            return f'{run["makespan"] / clairvoyant["makespan"]:.3f}' if run and clairvoyant else "-"

        verdict, versus = "-", "-"
        if warm is not None:
            missed = missed_targets(cold, warm, best, clairvoyant)
            verdict = "met" if not missed else "missed: " + "; ".join(missed)
            if best is not None:
                versus = f'{warm["makespan"] / best["makespan"]:.3f}'
        best_cell = f'{best["policy"]} ({best["makespan"]:.0f} s)' if best else "none"
        kills = "-" if warm is None else f'{warm["policy_kills"]}, {warm["wasted_seconds"]:.0f} s'
        term = binding_term(comparison["lower_bound"])
        print(f'| {comparison["trace"]} | {comparison["machine"]} | {bound:.0f} s ({term}) '
              f'| {cell("headroom (cold)")} | {cell("headroom (warm)")} | {kills} | {best_cell} '
              f'| {versus} | {cell(CLAIRVOYANT).split(",")[0]} | {against_clairvoyant(cold)} '
              f'| {against_clairvoyant(warm)} | {verdict} |')


if __name__ == "__main__":
    if sys.argv[1] == "--seeds":
        seeds(sys.argv[2:])
    else:
        main(sys.argv[1])
