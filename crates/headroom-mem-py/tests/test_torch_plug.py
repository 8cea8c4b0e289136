"""The allocator functions PyTorch's CUDAPluggableAllocator calls, driven the way PyTorch
drives them (through ctypes, from the extension's own shared library) on the host backend:
tags, offload and restore at unchanged addresses, statistics by tag, failures and refusals.
On a GPU machine, bench/mem/gpu_bench.py drives the same functions from torch itself."""

import ctypes
import itertools
import threading

import pytest

import headroom_mem
import headroom_mem.torch as hmt
from headroom_mem import _native

MIB = 1 << 20
# Each test serves its own device index: the functions' table is process-wide.
indices = itertools.count(100)


class Plug:
    """The two C functions, as PyTorch calls them, for one device index."""

    library = ctypes.CDLL(_native.__file__)
    alloc = library.headroom_mem_torch_alloc
    alloc.restype = ctypes.c_void_p
    alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    free = library.headroom_mem_torch_free
    free.restype = None
    free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]

    def __init__(self, caching=False):
        self.index = next(indices)
        hmt.configure(self.index, "host", caching)

    def allocate(self, size):
        pointer = self.alloc(size, self.index, None)
        assert pointer, f"the allocator refused {size} bytes: {hmt.last_failure(self.index)}"
        return pointer

    def release(self, pointer, size):
        self.free(pointer, size, self.index, None)

    def stats(self):
        return hmt.memory_stats(self.index)


def fill(pointer, size, seed):
    pattern = bytes((seed + i) % 251 for i in range(size))
    ctypes.memmove(pointer, pattern, size)
    return pattern


def test_tagged_memory_is_offloaded_and_restored_at_the_same_addresses():
    plug = Plug()
    sizes = [1 * MIB, 3 * MIB, 5 * MIB + 512]
    with hmt.tag("weights"):
        weights = [plug.allocate(size) for size in sizes]
    scratch = plug.allocate(2 * MIB)
    contents = [fill(pointer, size, seed) for seed, (pointer, size) in enumerate(zip(weights, sizes))]

    stats = plug.stats()
    assert stats["tags.weights.live_bytes"] == sum(sizes)
    assert stats["tags.untagged.live_bytes"] == 2 * MIB
    assert stats["allocation.all.current"] == 4
    assert stats["reserved_bytes.all.current"] >= sum(sizes) + 2 * MIB

    assert hmt.offload("weights", plug.index) == sum(sizes)
    stats = plug.stats()
    assert stats["tags.weights.offloaded_bytes"] == sum(sizes)
    assert stats["tags.weights.live_bytes"] == 0
    assert hmt.offload("weights", plug.index) == 0, "an offloaded tag is not offloaded twice"

    assert hmt.restore("weights", plug.index) == sum(sizes)
    for pointer, size, expected in zip(weights, sizes, contents):
        assert ctypes.string_at(pointer, size) == expected, "contents changed across the round trip"
    assert plug.stats()["tags.weights.live_bytes"] == sum(sizes)
    assert hmt.restore("weights", plug.index) == 0

    for pointer, size in zip(weights + [scratch], sizes + [2 * MIB]):
        plug.release(pointer, size)
    stats = plug.stats()
    assert stats["allocation.all.current"] == 0
    assert stats["reserved_bytes.all.current"] == 0, "under a MemPool the pool caches nothing"


def test_an_offloaded_allocation_can_be_freed_where_it_is():
    plug = Plug()
    with hmt.tag("kv"):
        pointer = plug.allocate(4 * MIB)
    assert hmt.offload("kv", plug.index) == 4 * MIB
    plug.release(pointer, 4 * MIB)
    stats = plug.stats()
    assert stats["allocation.all.current"] == 0
    assert "tags.kv.offloaded_bytes" not in stats


def test_a_tag_is_the_allocating_threads_own():
    plug = Plug()
    pointers = {}

    def untagged_thread():
        pointers["other"] = plug.allocate(MIB)

    with hmt.tag("mine"):
        pointers["mine"] = plug.allocate(MIB)
        worker = threading.Thread(target=untagged_thread)
        worker.start()
        worker.join()
    stats = plug.stats()
    assert stats["tags.mine.live_bytes"] == MIB
    assert stats["tags.untagged.live_bytes"] == MIB
    # The tag ends with its block.
    pointers["after"] = plug.allocate(MIB)
    assert plug.stats()["tags.untagged.live_bytes"] == 2 * MIB
    for pointer in pointers.values():
        plug.release(pointer, MIB)


def test_the_whole_allocator_mode_caches_and_refuses_to_offload():
    plug = Plug(caching=True)
    pointer = plug.allocate(MIB)
    plug.release(pointer, MIB)
    assert plug.alloc(MIB, plug.index, None) == pointer, "a cached block serves the next request"
    plug.release(pointer, MIB)
    assert plug.stats()["reserved_bytes.all.current"] > 0
    assert _native.plug_empty_cache(plug.index) > 0
    assert plug.stats()["reserved_bytes.all.current"] == 0
    with pytest.raises(RuntimeError, match="MemPool"):
        hmt.offload("anything", plug.index)


def test_a_request_that_cannot_be_served_returns_null_and_says_why():
    plug = Plug()
    assert hmt.last_failure(plug.index) is None
    assert plug.alloc(1 << 62, plug.index, None) is None
    failure = hmt.last_failure(plug.index)
    assert "out of memory" in failure.lower() and "fragmentation" in failure, failure
    assert plug.alloc(-1, plug.index, None) is None, "a negative size is refused, not wrapped"


def test_an_unconfigured_device_gets_null_and_a_clear_error():
    index = next(indices)
    assert Plug.alloc(MIB, index, None) is None
    Plug.free(None, MIB, index, None)  # nothing to free: ignored, not a crash
    with pytest.raises(KeyError, match="does not serve PyTorch yet"):
        hmt.memory_stats(index)


def test_devices_that_cannot_serve_pytorch_are_refused():
    with pytest.raises(ValueError, match="cannot serve PyTorch"):
        hmt.configure(next(indices), "sim:datacenter")
    with pytest.raises(ValueError, match="accepted forms"):
        hmt.configure(next(indices), "gpu")
    if not headroom_mem.CUDA:
        return
    try:
        hmt.configure(next(indices), "cuda:0")
    except RuntimeError as error:
        assert "cuda:0" in str(error) and ("libcuda" in str(error) or "virtual memory" in str(error))
    else:
        print("skipped the no-driver case: this machine has a CUDA device")


def test_a_device_with_live_memory_is_not_reconfigured():
    plug = Plug()
    pointer = plug.allocate(MIB)
    hmt.configure(plug.index, "host", False)  # a second MemPool on the device: the same plug
    assert plug.stats()["allocation.all.current"] == 1
    with pytest.raises(RuntimeError, match="live allocations"):
        hmt.configure(plug.index, "host", True)
    plug.release(pointer, MIB)
    hmt.configure(plug.index, "host", True)


def test_tags_are_non_empty_strings():
    with pytest.raises(ValueError, match="non-empty string"):
        with hmt.tag(""):
            pass


def test_torch_loads_the_allocator_functions_from_the_extension():
    torch = pytest.importorskip("torch", reason="torch is not installed; this test loads the functions through it")
    allocator = torch.cuda.memory.CUDAPluggableAllocator(_native.__file__, hmt.ALLOC_FN, hmt.FREE_FN)
    assert allocator.allocator() is not None
