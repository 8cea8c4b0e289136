#!/usr/bin/env python3
"""What list scheduling can reach on a CPU-bound trace, memory aside (BENCHMARKS.md).

Critical-path list scheduling: whenever a job ends, start the ready jobs with the longest
chain of work from them on first, as long as their threads fit on the cores (a job always
starts on an idle machine), so no job is ever slowed by oversubscription. Memory is ignored,
so no policy that admits by memory and runs jobs in a chain-first order can do better.

Usage: python3 bench/sim/list_schedule.py [TRACE] [CORES]
       (default traces/rustc-heavy.json on 16 cores)
"""
import json
import sys


def main(path, cores):
    jobs = json.load(open(path))["jobs"]
    count = len(jobs)
    seconds = [job["duration"] for job in jobs]
    threads = [job["cpu"] / job["duration"] for job in jobs]
    deps = [job.get("deps", []) for job in jobs]
    # Each job's own seconds plus the longest chain that waits on it; dependencies point to
    # earlier jobs, so one pass from the back finds them.
    waiting_on = [[] for _ in range(count)]
    for job, inputs in enumerate(deps):
        for dep in inputs:
            waiting_on[dep].append(job)
    chain = [0.0] * count
    for job in reversed(range(count)):
        chain[job] = seconds[job] + max((chain[k] for k in waiting_on[job]), default=0.0)

    now, done, running, started = 0.0, set(), [], set()
    while len(done) < count:
        ready = [j for j in range(count)
                 if j not in started and all(dep in done for dep in deps[j])]
        ready.sort(key=lambda j: -chain[j])
        busy = sum(threads[j] for _, j in running)
        for job in ready:
            if len(running) >= cores:
                break
            if running and busy + threads[job] > cores + 1e-9:
                continue
            running.append((now + seconds[job], job))
            started.add(job)
            busy += threads[job]
        running.sort()
        now, job = running.pop(0)
        done.add(job)

    cpu = sum(job["cpu"] for job in jobs) / cores
    bound = max(cpu, max(chain))
    print(f"critical path {max(chain):.1f} s, CPU work / cores {cpu:.1f} s")
    print(f"list schedule {now:.1f} s = {now / bound:.3f}x of the larger")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "traces/rustc-heavy.json",
         int(sys.argv[2]) if len(sys.argv) > 2 else 16)
