#!/usr/bin/env python3
"""Turns `headroom sim --json` output into the Markdown table of BENCHMARKS.md.

Per trace and machine: the lower bound, headroom (cold and warm) against it, OOM events, the
jobs warm headroom killed itself and the work they lost, the best baseline that had no OOM event, and the clairvoyant reference (never a baseline). A target is met when headroom has zero OOM events,
finishes within 1.10x of the lower bound and is at least as fast as every zero-OOM baseline.
"""
import json
import sys

CLAIRVOYANT = "clairvoyant greedy (reference)"


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
        safe = [o for o in outcomes
                if o["family"] not in ("headroom", "reference") and o["oom_events"] == 0 and o["stalled"] is None]
        best = min(safe, key=lambda o: o["makespan"]) if safe else None

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
            missed = []
            if warm["oom_events"] > 0:
                missed.append("OOM")
            if warm["makespan"] > 1.10 * bound:
                missed.append(">1.10× bound")
            if best is not None and warm["makespan"] > best["makespan"] * (1 + 1e-9):
                missed.append("slower than " + best["policy"])
            verdict = "met" if not missed else "missed: " + "; ".join(missed)
            if best is not None:
                versus = f'{warm["makespan"] / best["makespan"]:.2f}'
        best_cell = f'{best["policy"]} ({best["makespan"]:.0f} s)' if best else "none"
        kills = "-" if warm is None else f'{warm["policy_kills"]}, {warm["wasted_seconds"]:.0f} s'
        print(f'| {comparison["trace"]} | {comparison["machine"]} | {bound:.0f} s '
              f'| {cell("headroom (cold)")} | {cell("headroom (warm)")} | {kills} | {best_cell} '
              f'| {versus} | {cell(CLAIRVOYANT).split(",")[0]} | {verdict} |')


if __name__ == "__main__":
    main(sys.argv[1])
