#!/usr/bin/env python3
"""The best schedule a constraint solver finds for a trace, when no job is ever slowed
(BENCHMARKS.md, rustc-heavy).

Every job runs at full speed for its recorded duration; the jobs running at once may ask for
at most the machine's cores (a job's threads: CPU time over duration) and, if given, hold at
most BUDGET GiB at their peaks; a job starts after everything it depends on. OR-Tools' CP-SAT
minimises the makespan within a time limit and prints the best schedule found and the
solver's own bound for this model. A schedule it finds is one a policy could follow; its bound
is not a bound for the simulator, where jobs may share cores and slow down.

Needs OR-Tools: python3 -m pip install ortools
Usage: python3 bench/sim/cpsat_schedule.py [TRACE] [CORES] [BUDGET-GIB] [SECONDS]
       (default traces/rustc-heavy.json, 16 cores, 30 GiB, 60 s of solving; a budget of
       0 ignores memory)
"""
import json
import sys

from ortools.sat.python import cp_model

# Durations in tenths of a second, threads in halves of a core, memory in MiB: CP-SAT counts
# in whole numbers.
TIME, CORE, MEMORY = 10, 2, 1 << 20


def main(path, cores, budget_gib, seconds):
    jobs = json.load(open(path))["jobs"]
    horizon = sum(round(job["duration"] * TIME) for job in jobs)
    model = cp_model.CpModel()
    starts, ends, intervals = [], [], []
    for index, job in enumerate(jobs):
        start = model.new_int_var(0, horizon, f"start {index}")
        end = model.new_int_var(0, horizon, f"end {index}")
        length = max(1, round(job["duration"] * TIME))
        intervals.append(model.new_interval_var(start, length, end, job["label"]))
        starts.append(start)
        ends.append(end)
    for index, job in enumerate(jobs):
        for dep in job.get("deps", []):
            model.add(starts[index] >= ends[dep])
    threads = [max(1, round(job["cpu"] / job["duration"] * CORE)) for job in jobs]
    model.add_cumulative(intervals, threads, cores * CORE)
    if budget_gib:
        peaks = [max(1, round(job["peak"] / MEMORY)) for job in jobs]
        model.add_cumulative(intervals, peaks, round(budget_gib * (1 << 30) / MEMORY))
    makespan = model.new_int_var(0, horizon, "makespan")
    model.add_max_equality(makespan, ends)
    model.minimize(makespan)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = seconds
    solver.parameters.num_workers = 2
    status = solver.solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        sys.exit(f"no schedule found in {seconds} s ({solver.status_name(status)})")
    memory = f"{budget_gib:g} GiB at peaks" if budget_gib else "memory ignored"
    print(f"{path} on {cores} cores, {memory}: best schedule "
          f"{solver.value(makespan) / TIME:.1f} s ({solver.status_name(status).lower()}), "
          f"solver's bound {solver.best_objective_bound / TIME:.1f} s")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0] if len(args) > 0 else "traces/rustc-heavy.json",
         int(args[1]) if len(args) > 1 else 16,
         float(args[2]) if len(args) > 2 else 30.0,
         float(args[3]) if len(args) > 3 else 60.0)
