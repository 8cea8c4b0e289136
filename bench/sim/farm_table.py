#!/usr/bin/env python3
"""Turns `headroom sim --farm ... --json` output into the farm scaling table of BENCHMARKS.md.

`farm_table.py FARM.json` prints, per trace and machine, one row per farm: its nodes and
compile slots, the lower bound (the machine and the farm's nodes together, as if one machine),
and for each policy its makespan and its OOM events here (on the machine the build runs on) and
on the farm's nodes. A stalled run shows as such.
"""
import json
import sys


def column(outcome):
    """The policy's column: its name without the `-jN` that grows with the farm."""
    return outcome["policy"] if outcome["family"] == "headroom" else outcome["family"]


def cell(outcome):
    here = outcome["oom_events"] - outcome["node_oom_events"]
    if outcome["stalled"] is not None:
        return f"stalled · {here} / {outcome['node_oom_events']}"
    return f"{outcome['makespan']:.0f} s · {here} / {outcome['node_oom_events']}"


def main(path):
    with open(path) as file:
        comparisons = json.load(file)
    groups = {}
    for comparison in comparisons:
        groups.setdefault((comparison["trace"], comparison["machine"]), []).append(comparison)
    for (trace, machine), rows in groups.items():
        policies = [column(outcome) for outcome in rows[0]["outcomes"]]
        print(f"{trace} from {machine}: makespan · OOM events here / on the farm's nodes\n")
        print("| farm | slots (-j) | lower bound | " + " | ".join(policies) + " |")
        print("|---|---:|---:|" + "---:|" * len(policies))
        for comparison in rows:
            nodes, node = comparison["farm"].split("x", 1)
            cores = int(node.split("c/")[0])
            outcomes = {column(outcome): outcome for outcome in comparison["outcomes"]}
            cells = [cell(outcomes[policy]) for policy in policies]
            bound = comparison["lower_bound"]["seconds"]
            print(f"| {comparison['farm']} | {int(nodes) * cores} | {bound:.0f} s | "
                  + " | ".join(cells) + " |")
        print()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: farm_table.py FARM.json")
    main(sys.argv[1])
