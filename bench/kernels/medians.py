#!/usr/bin/env python3
"""Prints median, min and max (ms) per command of a hyperfine --export-json file."""
import json
import statistics
import sys

for result in json.load(open(sys.argv[1]))["results"]:
    times = [t * 1000 for t in result["times"]]
    command = result["command"]
    print(f"median {statistics.median(times):9.1f} ms  min {min(times):9.1f}  max {max(times):9.1f}  {command}")
