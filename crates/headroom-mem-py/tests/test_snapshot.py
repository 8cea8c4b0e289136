"""Snapshots: the pickle `pool.snapshot(path)` writes is what `torch.cuda.memory._snapshot`
returns, and PyTorch's own `torch.cuda._memory_viz` reads it (as tests/snapshot.rs checks
on the Rust side)."""

import pickle

import pytest

import headroom_mem
from conftest import MIB


def recorded(pool):
    """The sequence of tests/snapshot.rs: weights, forward activations, backward, an OOM."""
    alloc = lambda elements: pool.alloc_buffer(elements, "bfloat16")  # noqa: E731
    weights = alloc(1 << 20)
    with pool.stage("forward"):
        activations = [alloc(i << 18) for i in range(1, 6)]
        pool.free(alloc(1000))
    with pool.stage("backward"):
        gradient = alloc(1 << 20)
        for buf in activations:
            pool.free(buf)
        with pytest.raises(headroom_mem.OutOfMemoryError):
            pool.alloc_buffer(1 << 30, "float32")
    return weights, gradient


def test_snapshot_pickle_has_pytorch_structure(tmp_path):
    pool = headroom_mem.MemoryPool("sim:global=256M,shared=64K,local=0", record_trace=True)
    live = recorded(pool)
    path = tmp_path / "snapshot.pickle"
    returned = pool.snapshot(path)
    with open(path, "rb") as f:
        snapshot = pickle.load(f)
    assert snapshot == returned
    assert set(snapshot) >= {"segments", "device_traces", "allocator_settings"}
    total = sum(segment["total_size"] for segment in snapshot["segments"])
    assert total == pool.reserved_bytes()
    (trace,) = snapshot["device_traces"]
    actions = [event["action"] for event in trace]
    assert actions.count("alloc") == actions.count("free_completed") + len(live)
    assert "oom" in actions
    stages = {frame["name"] for event in trace for frame in event["frames"]}
    assert {"forward", "backward"} <= stages


def test_memory_viz_reads_the_snapshot(tmp_path):
    pytest.importorskip("torch", reason="torch is not installed; memory_viz comes with it")
    from torch.cuda import _memory_viz

    pool = headroom_mem.MemoryPool("host", record_trace=True)
    live = recorded_host(pool)
    path = tmp_path / "snapshot.pickle"
    pool.snapshot(path)
    with open(path, "rb") as f:
        snapshot = pickle.load(f)
    raw = lambda lines: lines  # noqa: E731  (no flamegraph.pl download)
    segments = _memory_viz.segments(snapshot, format_flamegraph=raw)
    assert f"active_allocated;<non-python> {MIB}" in segments, "the weights' block"
    assert _memory_viz.memory(snapshot, format_flamegraph=raw)
    summary = _memory_viz.segsum(snapshot)
    assert "segment" in summary.lower()
    trace = _memory_viz.trace(snapshot)
    assert "cudaMalloc" in trace and "free completed" in trace
    plot = _memory_viz.trace_plot(snapshot)
    assert "<html" in plot.lower() and "Active Memory Timeline" in plot
    assert "<html" in _memory_viz.segment_plot(snapshot).lower()
    del live


def recorded_host(pool):
    """A smaller sequence with stages, live buffers and frees, for a host pool."""
    weights = pool.alloc_buffer(MIB, "uint8")
    with pool.stage("forward"):
        activations = [pool.alloc_buffer(i * 4096, "float32") for i in range(1, 6)]
    with pool.stage("backward"):
        for buf in activations[:3]:
            pool.free(buf)
    return weights, activations
