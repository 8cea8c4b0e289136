"""The pool API on the host and simulated backends: buffers, scopes, aliases, copies,
workspaces, and statistics compared with the figures crates/headroom-mem/tests/pool.rs
asserts for the same sequence."""

import numpy as np
import pytest

import headroom_mem
from conftest import MIB, SIM_64M


def test_alloc_buffer_has_tilelang_shape_dtype_and_scope(pool):
    buf = pool.alloc_buffer((4, 8), "float32")
    assert buf.shape == (4, 8)
    assert buf.dtype == "float32"
    assert buf.itemsize == 4
    assert buf.nbytes == 128
    assert buf.strides == (8, 1)
    assert buf.scope == "global"
    assert buf.device == pool.device
    assert buf.data_ptr % 512 == 0
    shared = pool.alloc_buffer(16, np.float16, scope="shared")
    assert (shared.shape, shared.dtype, shared.scope) == ((16,), "float16", "shared")
    aligned = pool.alloc_buffer(10, np.dtype("int8"), alignment=4096)
    assert aligned.data_ptr % 4096 == 0


def test_host_round_trip_keeps_values_and_dtype(pool):
    values = np.arange(32, dtype=np.float32).reshape(4, 8)
    buf = pool.alloc_buffer(values.shape, values.dtype)
    buf.copy_from_host(values)
    back = buf.to_host()
    assert back.dtype == np.float32 and back.shape == (4, 8)
    np.testing.assert_array_equal(back, values)
    raw = pool.alloc_buffer(4, "int32")
    raw.copy_from_host(bytes(range(16)))
    assert raw.to_host().tobytes() == bytes(range(16))


def test_bfloat16_comes_back_as_bytes(pool):
    buf = pool.alloc_buffer(4, "bfloat16")
    buf.copy_from_host(b"\x80\x3f" * 4)
    assert buf.to_host() == b"\x80\x3f" * 4


def test_allocate_frees_at_the_end_of_the_block(pool):
    with pool.allocate((1024,), "float32") as buf:
        assert pool.memory_allocated() == 4096
        assert not buf.freed
    assert buf.freed
    assert pool.memory_allocated() == 0


def test_free_returns_memory_and_makes_the_buffer_unusable(pool):
    buf = pool.alloc_buffer(1000, "float64")
    assert pool.memory_allocated() == 8192
    pool.free(buf)
    assert pool.memory_allocated() == 0
    for use in (lambda: buf.to_host(), lambda: buf.data_ptr, lambda: buf.copy_from_host(b"")):
        with pytest.raises(RuntimeError, match="was freed"):
            use()
    pool.free(buf)  # freeing twice is harmless
    assert buf.shape == (1000,) and "freed" in repr(buf)


def test_alias_shares_memory_and_keeps_it_alive(pool):
    matrix = pool.alloc_buffer((4, 8), "float32")
    matrix.copy_from_host(np.arange(32, dtype=np.float32).reshape(4, 8))
    flat = pool.alias(matrix, 32)
    assert flat.data_ptr == matrix.data_ptr and flat.shape == (32,)
    second_half = pool.alias(matrix, 16, offset=64)
    assert second_half.to_host()[0] == 16.0
    second_half.copy_from_host(np.full(16, -1, np.float32))
    assert matrix.to_host()[3, 7] == -1.0
    as_bytes = pool.alias(matrix, 128, "uint8")
    assert as_bytes.dtype == "uint8"
    pool.free(matrix)
    assert pool.memory_allocated() > 0, "the aliases still hold the memory"
    assert flat.to_host()[0] == 0.0
    for alias in (flat, second_half, as_bytes):
        pool.free(alias)
    assert pool.memory_allocated() == 0


def test_copy_between_buffers_and_devices(host_pool, sim_pool):
    values = np.arange(256, dtype=np.int32)
    src = host_pool.alloc_buffer(256, "int32")
    src.copy_from_host(values)
    dst = sim_pool.alloc_buffer(256, "int32")
    headroom_mem.copy(dst, src)
    np.testing.assert_array_equal(dst.to_host(), values)
    # Within one allocation: disjoint halves copy, overlapping ranges are refused.
    low, high = host_pool.alias(src, 128), host_pool.alias(src, 128, offset=512)
    headroom_mem.copy(high, low)
    np.testing.assert_array_equal(src.to_host()[128:], values[:128])
    with pytest.raises(ValueError, match="overlap"):
        headroom_mem.copy(host_pool.alias(src, 128, offset=4), low)
    with pytest.raises(ValueError, match="copy sizes differ"):
        headroom_mem.copy(low, src)


def test_workspace_stages_reuse_one_allocation(sim_pool):
    # The figures of workspace_stages_reuse_one_allocation in tests/pool.rs.
    with sim_pool.workspace(4 * MIB) as workspace:
        allocations = sim_pool.memory_stats()["num_device_alloc"]
        first_addresses = []
        for index in range(5):
            with workspace.stage(f"stage{index}") as stage:
                a = stage.alloc(1024, "float32")
                b = stage.alloc(100, "float16", alignment=4096)
                assert b.data_ptr >= a.data_ptr + 4096 and b.data_ptr % 4096 == 0
                a.copy_from_host(np.full(1024, index, np.float32))
                first_addresses.append(a.data_ptr)
                with pytest.raises(ValueError, match=f"stage `stage{index}`"):
                    stage.alloc(4 * MIB, "uint8")
                with pytest.raises(RuntimeError, match="one stage at a time"):
                    workspace.stage("second")
            assert a.freed and b.freed, "a stage's buffers end with it"
        assert len(set(first_addresses)) == 1
        assert sim_pool.memory_stats()["num_device_alloc"] == allocations
        assert workspace.stages_run == 5
        assert workspace.peak_used == 4096 + 200
    assert sim_pool.memory_allocated() == 0


def test_stats_match_the_rust_figures(sim_pool):
    # The sequence and figures of stats_use_pytorch_keys_per_scope_with_reset_peak.
    pool = sim_pool
    small = pool.alloc_buffer(100, "float32")
    large = pool.alloc_buffer(3 * MIB, "uint8")
    shared = pool.alloc_buffer(1024, "float16", "shared")
    stats = pool.memory_stats()
    assert stats["requested_bytes.all.current"] == 400 + 3 * MIB
    assert stats["allocated_bytes.small_pool.current"] == 512
    assert stats["allocated_bytes.large_pool.current"] == 3 * MIB
    assert stats["reserved_bytes.small_pool.current"] == 2 * MIB
    assert stats["reserved_bytes.large_pool.current"] == 20 * MIB
    assert stats["active_bytes.all.current"] == stats["allocated_bytes.all.current"]
    assert stats["allocation.all.current"] == 2
    assert pool.memory_stats("shared")["requested_bytes.all.current"] == 2048
    assert len(stats) == 9 * 3 * 4 + 4
    pool.free(large)
    stats = pool.memory_stats()
    assert stats["allocated_bytes.all.peak"] == 512 + 3 * MIB
    assert stats["allocated_bytes.all.freed"] == 3 * MIB
    pool.reset_peak_memory_stats()
    assert pool.memory_stats()["allocated_bytes.all.peak"] == 512
    assert pool.memory_stats("shared")["requested_bytes.all.peak"] == 2048
    assert pool.reserved_bytes() == 22 * MIB
    pool.free(small)
    pool.free(shared)
    pool.empty_cache()
    stats = pool.memory_stats()
    assert stats["reserved_bytes.all.current"] == 0 == pool.reserved_bytes()
    assert stats["num_device_alloc"] == stats["num_device_free"]


def test_fragmentation_matches_the_rust_figures():
    # scattered_cache_is_reported_as_fragmentation: PyTorch's settings, 6 MiB pieces of one
    # 60 MiB segment, every other one freed.
    pool = headroom_mem.MemoryPool(SIM_64M, pytorch_defaults=True)
    pool.free(pool.alloc_buffer(60 * MIB, "uint8"))
    pieces = [pool.alloc_buffer(6 * MIB, "uint8") for _ in range(10)]
    for piece in pieces[1::2]:
        pool.free(piece)
    assert pool.fragmentation() > 0.7
    assert pool.memory_stats()["inactive_split_bytes.all.current"] == 30 * MIB
    with pytest.raises(headroom_mem.OutOfMemoryError) as caught:
        pool.alloc_buffer(12 * MIB, "uint8")
    oom = caught.value
    assert (oom.reserved - oom.allocated, oom.largest_free_block) == (30 * MIB, 6 * MIB)
    assert oom.fragmentation == pytest.approx(pool.fragmentation()) and oom.fragmentation > 0.7
    assert f"{oom.fragmentation:.2f}" in str(oom) and "fragmented" in str(oom)
    for piece in pieces[::2]:
        pool.free(piece)
    assert pool.fragmentation() == 0.0


def test_snapshot_segments_add_up_to_reserved_bytes(pool):
    keep = [pool.alloc_buffer(n, "uint8") for n in (100, 3 * MIB)]
    snapshot = pool.snapshot()
    assert sum(s["total_size"] for s in snapshot["segments"]) == pool.reserved_bytes()
    assert sum(s["allocated_size"] for s in snapshot["segments"]) == pool.memory_allocated()
    del keep


def test_host_memory_limit_and_max_size():
    limited = headroom_mem.MemoryPool("host", memory_limit="8M")
    with pytest.raises(headroom_mem.OutOfMemoryError):
        limited.alloc_buffer(16 * MIB, "uint8")
    capped = headroom_mem.MemoryPool("host", max_size=30 * MIB)
    keep = capped.alloc_buffer(25 * MIB, "uint8")
    with pytest.raises(headroom_mem.OutOfMemoryError, match="max_size") as caught:
        capped.alloc_buffer(25 * MIB, "uint8")
    assert caught.value.max_size == 30 * MIB
    del keep
