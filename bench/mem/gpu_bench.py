"""headroom-mem on a real GPU, through Python, beside PyTorch in the same process.

    python3 bench/mem/gpu_bench.py [--json OUT] [--steps N]

Needs the headroom-mem wheel (built with the `cuda` feature, as wheels are), torch with
CUDA, and optionally cupy. Prints one line per figure and writes them all to --json:

1. the CUDA backend through Python: a buffer shared with torch and cupy by DLPack, a snapshot
   that torch.cuda._memory_viz reads;
2. copy bandwidth, 64 MiB, best of 10: headroom-mem pageable (NumPy arrays, read and
   written in place) and pinned, torch pageable and pinned;
3. a small model's training steps with PyTorch's default allocator and inside a
   headroom_mem.torch.MemPool: peak allocated and reserved, time per step, and the loss
   (identical: same seed, same kernels);
4. offloading the model's weights (a tag) to pinned memory and back: device memory freed,
   training continues with the same loss;
5. a MemPool that still holds live tensors handing its freed segments back with
   `release()`, where torch.cuda.empty_cache() cannot (pytorch#159674);
6. headroom-mem as PyTorch's whole allocator (`use_as_default_allocator`), in a fresh process
   since PyTorch swaps allocators only before the first CUDA allocation.

Each part runs on when another fails, so one run reports every figure it can; the exit status
is 1 if any part failed.
"""

import argparse
import json
import math
import os
import pickle
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np
import torch

import headroom_mem
import headroom_mem.torch as hmt

MiB = 1 << 20
results = {}


def record(name, value, unit=""):
    results[name] = value
    shown = f"{value:.2f}" if isinstance(value, float) else value
    print(f"{name}: {shown} {unit}".rstrip(), flush=True)


def check_cuda_backend():
    pool = headroom_mem.MemoryPool("cuda:0", record_trace=True)
    data = np.arange(1 << 20, dtype=np.float32)
    buf = pool.alloc_buffer((1 << 20,), "float32")
    buf.copy_from_host(data)
    tensor = torch.from_dlpack(buf)
    assert tensor.device.type == "cuda", tensor.device
    assert tensor.data_ptr() == buf.data_ptr
    assert float(tensor.sum()) == float(data.sum())
    tensor.mul_(2)  # written through torch ...
    torch.cuda.synchronize()
    assert np.array_equal(buf.to_host(), data * 2)  # ... read through headroom-mem
    try:
        import cupy

        array = cupy.from_dlpack(buf)
        assert int(array.data.ptr) == buf.data_ptr
        record("cupy_shares_memory", True)
    except ImportError:
        record("cupy_shares_memory", "skipped: no cupy")
    from torch.cuda import _memory_viz

    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "snapshot.pickle")
        pool.snapshot(path)
        with open(path, "rb") as file:
            snapshot = pickle.load(file)
    no_download = lambda lines: lines  # noqa: E731  (format_flamegraph fetches flamegraph.pl)
    assert _memory_viz.segments(snapshot, format_flamegraph=no_download)
    assert _memory_viz.segsum(snapshot)
    record("cuda_backend_through_python", "ok")
    del tensor, buf


def best_seconds(action, repeats=10):
    best = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        action()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def copy_bandwidth():
    size = 64 * MiB
    gbps = lambda seconds: size / seconds / 1e9  # noqa: E731
    device = headroom_mem.MemoryPool("cuda:0")
    pinned = headroom_mem.MemoryPool("pinned:0")
    host = np.ones(size, dtype=np.uint8)
    on_gpu = device.alloc_buffer((size,), "uint8")
    staged = pinned.alloc_buffer((size,), "uint8")
    staged.copy_from_host(host)
    record("headroom_pageable_h2d_GBps", gbps(best_seconds(lambda: on_gpu.copy_from_host(host))))
    back = np.empty_like(host)
    record("headroom_pageable_d2h_GBps", gbps(best_seconds(lambda: on_gpu.to_host(out=back))))
    record("headroom_pinned_h2d_GBps", gbps(best_seconds(lambda: headroom_mem.copy(on_gpu, staged))))
    record("headroom_pinned_d2h_GBps", gbps(best_seconds(lambda: headroom_mem.copy(staged, on_gpu))))
    cpu = torch.ones(size, dtype=torch.uint8)
    cpu_pinned = cpu.pin_memory()
    gpu = torch.empty(size, dtype=torch.uint8, device="cuda")
    record("torch_pageable_h2d_GBps", gbps(best_seconds(lambda: gpu.copy_(cpu))))
    record("torch_pageable_d2h_GBps", gbps(best_seconds(lambda: cpu.copy_(gpu))))
    record("torch_pinned_h2d_GBps", gbps(best_seconds(lambda: gpu.copy_(cpu_pinned, non_blocking=True))))
    record("torch_pinned_d2h_GBps", gbps(best_seconds(lambda: cpu_pinned.copy_(gpu, non_blocking=True))))
    for direction in ("h2d", "d2h"):
        ratio = results[f"headroom_pinned_{direction}_GBps"] / results[f"torch_pinned_{direction}_GBps"]
        record(f"pinned_{direction}_ratio_to_torch", ratio)


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(2048, 8192), torch.nn.GELU(),
        torch.nn.Linear(8192, 8192), torch.nn.GELU(),
        torch.nn.Linear(8192, 2048),
    ).cuda()


def train(net, steps, batch=256):
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-4)
    generator = torch.Generator(device="cuda").manual_seed(1)
    loss = None
    start = time.perf_counter()
    for step in range(steps):
        batch_size = batch if step % 3 else batch // 2  # changing shapes, as real loops have
        x = torch.randn(batch_size, 2048, device="cuda", generator=generator)
        loss = (net(x) - x).pow(2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    torch.cuda.synchronize()
    return float(loss), (time.perf_counter() - start) / steps


def training(steps):
    train(model(), 3)  # loads the kernels and cuBLAS's workspace before either run is timed
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    loss, per_step = train(model(), steps)
    record("default_peak_allocated_MiB", torch.cuda.max_memory_allocated() / MiB)
    record("default_peak_reserved_MiB", torch.cuda.max_memory_reserved() / MiB)
    record("default_ms_per_step", per_step * 1e3)
    record("default_loss", loss)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()

    pool = hmt.MemPool()
    with torch.cuda.use_mem_pool(pool):
        loss_pool, per_step = train(model(), steps)
    record("headroom_pool_peak_allocated_MiB", torch.cuda.max_memory_allocated() / MiB)
    record("headroom_pool_peak_reserved_MiB", torch.cuda.max_memory_reserved() / MiB)
    record("headroom_pool_reserved_by_headroom_MiB", hmt.memory_stats()["reserved_bytes.all.peak"] / MiB)
    record("headroom_pool_ms_per_step", per_step * 1e3)
    record("headroom_pool_loss", loss_pool)
    record("headroom_pool_loss_matches_default", math.isclose(loss_pool, loss, rel_tol=1e-5))
    snapshot = pool.snapshot()
    record("headroom_pool_segments_in_torch_snapshot", len(snapshot))
    del pool


def offload_round_trip(steps):
    weights = hmt.MemPool()
    with torch.cuda.use_mem_pool(weights), hmt.tag("weights"):
        net = model()
    # The same steps before and after the round trip as a model that never left the device.
    train(net, steps)
    torch.cuda.synchronize()
    free_before, _ = torch.cuda.mem_get_info()
    moved = hmt.offload("weights")
    free_during, _ = torch.cuda.mem_get_info()
    record("offloaded_MiB", moved / MiB)
    record("device_memory_freed_by_offload_MiB", (free_during - free_before) / MiB)
    hmt.restore("weights")
    net_reference = model()
    train(net_reference, steps)
    loss_after, _ = train(net, steps)
    loss_reference, _ = train(net_reference, steps)
    record("loss_after_restore_matches", math.isclose(loss_after, loss_reference, rel_tol=1e-5))


def release_freed_segments():
    """pytorch#159674: a MemPool the program keeps never hands free segments back."""
    reserved = lambda: hmt.memory_stats()["reserved_bytes.all.current"] / MiB  # noqa: E731
    hmt.release()  # what earlier parts left behind
    pool = hmt.MemPool()
    with torch.cuda.use_mem_pool(pool):
        live = [torch.full((64 * MiB // 4,), float(i), device="cuda") for i in range(4)]
        scratch = [torch.empty((16 + i) * MiB // 4, device="cuda") for i in range(32)]
    del scratch
    torch.cuda.synchronize()
    record("release_live_MiB", sum(t.numel() * 4 for t in live) / MiB)
    record("release_reserved_before_MiB", reserved())
    torch.cuda.empty_cache()
    record("release_reserved_after_torch_empty_cache_MiB", reserved())
    record("release_returned_MiB", pool.release() / MiB)
    record("release_reserved_after_MiB", reserved())
    with torch.cuda.use_mem_pool(pool):
        more = torch.ones(32 * MiB // 4, device="cuda")
    record("release_pool_usable_after", float(more.sum()) == 32 * MiB // 4)
    record("release_live_tensors_intact", all(float(t[-1]) == i for i, t in enumerate(live)))
    del live, more
    pool.release()
    record("release_reserved_after_all_freed_MiB", reserved())
    del pool


def whole_allocator(steps):
    """Runs in a child process: the training loop with headroom-mem as the whole allocator."""
    hmt.use_as_default_allocator()
    train(model(), 3)  # the same warm-up as the default allocator's run
    loss, per_step = train(model(), steps)
    stats = hmt.memory_stats()
    print(json.dumps({
        "loss": loss, "ms_per_step": per_step * 1e3,
        "peak_reserved_MiB": stats["reserved_bytes.all.peak"] / MiB,
        "peak_allocated_MiB": stats["allocated_bytes.all.peak"] / MiB,
        "segments_reserved": stats.get("segment.all.allocated"),
        "segments_released": stats.get("segment.all.freed"),
    }))


def whole_allocator_in_child(steps):
    child = subprocess.run(
        [sys.executable, __file__, "--whole-allocator", "--steps", str(steps)],
        capture_output=True, text=True, timeout=300,
    )
    if child.returncode != 0:
        raise RuntimeError(f"the whole-allocator child failed:\n{child.stderr[-4000:]}")
    figures = json.loads(child.stdout.strip().splitlines()[-1])
    for name, value in figures.items():
        record(f"whole_allocator_{name}", value)
    if "default_loss" in results:
        record("whole_allocator_loss_matches_default",
               math.isclose(figures["loss"], results["default_loss"], rel_tol=1e-5))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--whole-allocator", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.whole_allocator:
        whole_allocator(args.steps)
        return 0
    record("device", torch.cuda.get_device_name(0))
    record("torch", torch.__version__)
    parts = [
        check_cuda_backend,
        copy_bandwidth,
        lambda: training(args.steps),
        lambda: offload_round_trip(max(3, args.steps // 10)),
        release_freed_segments,
        lambda: whole_allocator_in_child(args.steps),
    ]
    failed = 0
    for part in parts:
        try:
            part()
        except Exception as error:  # report it and go on: one GPU run should show every part
            traceback.print_exc()
            results.setdefault("errors", []).append(repr(error))
            failed = 1
    if args.json:
        with open(args.json, "w") as file:
            json.dump(results, file, indent=2)
    return failed


if __name__ == "__main__":
    sys.exit(main())
