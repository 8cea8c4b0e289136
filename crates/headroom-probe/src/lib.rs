//! Memory readings: process RSS, cgroup v1/v2 usage, limits and OOM events, MemAvailable, PSI, GPU memory.
