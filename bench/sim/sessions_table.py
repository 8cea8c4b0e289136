"""The table of bench/sim/sessions.sh: per sessions, machine and headroom cold or warm, each
way of governing the sessions with its makespan, its ratio to one session over the union of
the builds, the OOM events, the jobs headroom killed and re-ran, the work thrown away, and when
each session ended.

Usage: python3 bench/sim/sessions_table.py SESSIONS-N.json...   (`headroom sim --sessions N --json`)
"""

import json
import sys

NAMES = {
    "union": "one session over the union",
    "shared": "shared governor",
    "per-session": "per-session governors",
}


def main(paths):
    print("| sessions | machine | headroom | governors | makespan | ×union | OOM events | kills by headroom | wasted | session ends |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for path in paths:
        with open(path) as file:
            comparisons = json.load(file)
        for comparison in comparisons:
            union = next(o for o in comparison["outcomes"] if o["governors"] == "union")
            for outcome in comparison["outcomes"]:
                done = outcome["stalled"] is None
                makespan = f"{outcome['makespan']:.0f} s" if done else "stalled"
                ratio = f"{outcome['makespan'] / union['makespan']:.2f}" if done else "-"
                ends = " ".join(f"{end:.0f}" for end in outcome["session_ends"])
                print(
                    f"| {comparison['sessions']} | {comparison['machine']} "
                    f"| {comparison['policy'].removeprefix('headroom ').strip('()')} "
                    f"| {NAMES[outcome['governors']]} | {makespan} | {ratio} "
                    f"| {outcome['oom_events']} | {outcome['policy_kills']} "
                    f"| {outcome['wasted_seconds']:.0f} s | {ends} s |"
                )


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__.strip().splitlines()[-1])
    main(sys.argv[1:])
