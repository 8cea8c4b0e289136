"""Errors: Python exceptions with the Rust error's message, naming the value and the fix."""

import pytest

import headroom_mem
from conftest import MIB


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "pinned:x", "sim", "sim:texture=1M", "sim:global=lots", "host:1"])
def test_bad_device_names_the_value_and_the_accepted_forms(device):
    with pytest.raises(ValueError) as caught:
        headroom_mem.MemoryPool(device)
    assert repr(device).replace("'", '"') in str(caught.value)
    assert "sim:datacenter" in str(caught.value) and "cuda:N" in str(caught.value)


@pytest.mark.parametrize("device", ["cuda:0", "pinned:0"])
def test_cuda_without_a_driver_raises_a_clear_error(device):
    try:
        pool = headroom_mem.MemoryPool(device)
    except (RuntimeError, ValueError) as error:
        message = str(error)
        assert device in message
        assert "libcuda" in message or "without the `cuda` feature" in message or "driver" in message
    else:
        print("skipped the no-driver case: this machine has a CUDA device")
        assert pool.device == device


def test_memory_limit_is_for_host_only():
    with pytest.raises(ValueError, match="memory_limit applies to the \"host\" and \"pinned\" devices only"):
        headroom_mem.MemoryPool("sim:datacenter", memory_limit="1G")
    with pytest.raises(ValueError, match="invalid size `lots`"):
        headroom_mem.MemoryPool("host", max_size="lots")


@pytest.mark.parametrize("dtype", ["complex64", "float8", 3, object])
def test_bad_dtype_lists_the_supported_ones(host_pool, dtype):
    with pytest.raises(ValueError, match="is not supported; use one of bool, uint8"):
        host_pool.alloc_buffer(4, dtype)


def test_bad_scope_shape_and_alignment(host_pool):
    with pytest.raises(ValueError, match='scope "texture" is not one of'):
        host_pool.alloc_buffer(4, "float32", "texture")
    with pytest.raises(ValueError, match="shape must be an int or a sequence"):
        host_pool.alloc_buffer("big", "float32")
    with pytest.raises(ValueError, match="alignment 48 is not a power of two"):
        host_pool.alloc_buffer(4, "float32", alignment=48)
    with pytest.raises(ValueError, match="too large to address"):
        host_pool.alloc_buffer((1 << 62, 1 << 62), "float32")


def test_out_of_memory_carries_the_figures(sim_pool):
    # The figures of out_of_memory_is_typed_counted_and_explained in tests/pool.rs.
    big = sim_pool.alloc_buffer(40 * MIB, "uint8")
    with pytest.raises(headroom_mem.OutOfMemoryError) as caught:
        sim_pool.alloc_buffer(40 * MIB, "uint8")
    oom = caught.value
    assert isinstance(oom, MemoryError)
    assert (oom.requested, oom.rounded) == (40 * MIB, 40 * MIB)
    assert (oom.allocated, oom.reserved) == (40 * MIB, 40 * MIB)
    assert (oom.device_free, oom.device_capacity) == (24 * MIB, 64 * MIB)
    assert oom.largest_free_block == 0 and oom.fragmentation == 0.0
    assert oom.scope == "global" and oom.max_size is None
    message = str(oom)
    assert "tried to allocate 40.0 MiB" in message
    assert "24.0 MiB unreserved of 64.0 MiB" in message
    assert "fragmentation of the global tier" in message
    stats = sim_pool.memory_stats()
    assert (stats["num_ooms"], stats["num_alloc_retries"]) == (1, 1)
    del big


def test_tiers_have_their_own_capacity(sim_pool):
    with pytest.raises(headroom_mem.OutOfMemoryError, match="shared tier") as caught:
        sim_pool.alloc_buffer(128 << 10, "uint8", "shared")
    assert caught.value.scope == "shared"


def test_alias_out_of_range_and_misaligned(host_pool):
    buf = host_pool.alloc_buffer((4, 8), "float32")
    with pytest.raises(ValueError, match="needs 132 bytes but the buffer has 128"):
        host_pool.alias(buf, 33)
    with pytest.raises(ValueError, match="needs 132 bytes"):
        host_pool.alias(buf, 8, offset=100)
    with pytest.raises(ValueError, match="not a multiple of the F32 element size"):
        host_pool.alias(buf, 4, offset=2)


def test_host_copy_checks_size_dtype_and_layout(host_pool):
    np = pytest.importorskip("numpy", reason="numpy is not installed")
    buf = host_pool.alloc_buffer(8, "float32")
    with pytest.raises(ValueError, match="destination has 32 bytes, source 16"):
        buf.copy_from_host(np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="does not match buffer dtype F32"):
        buf.copy_from_host(np.zeros(4, np.float64))
    with pytest.raises(ValueError, match="not C-contiguous"):
        buf.copy_from_host(np.zeros((8, 2), np.float32)[:, 0])
    with pytest.raises(TypeError, match="neither the buffer protocol nor DLPack"):
        buf.copy_from_host(3.5)
    with pytest.raises(TypeError, match="use headroom_mem.copy"):
        buf.copy_from_host(buf)


def test_use_after_free_raises(host_pool):
    buf = host_pool.alloc_buffer(4, "float32")
    host_pool.free(buf)
    with pytest.raises(RuntimeError, match="was freed"):
        buf.__dlpack__()
    with pytest.raises(RuntimeError, match="was freed"):
        host_pool.alias(buf, 2)
    other = host_pool.alloc_buffer(4, "float32")
    with pytest.raises(RuntimeError, match="was freed"):
        headroom_mem.copy(other, buf)


@pytest.mark.parametrize("device", ["cuda", "cuda:3", "pinned", "pinned:1"])
def test_cuda_forms_are_understood_before_the_device_is_opened(device):
    try:
        headroom_mem.MemoryPool(device)
    except (RuntimeError, ValueError) as error:
        assert "not understood" not in str(error), error
        assert device in str(error)


def test_simulated_tiers_left_out_take_the_datacenter_figures():
    pool = headroom_mem.MemoryPool("sim:global=256M,local=0")
    held = pool.alloc_buffer((200 << 20,), "uint8")
    with pytest.raises(headroom_mem.OutOfMemoryError):
        pool.alloc_buffer((100 << 20,), "uint8")
    assert held.nbytes == 200 << 20
    pool.alloc_buffer((16 << 10,), "uint8", "shared")  # the datacenter shared tier
    with pytest.raises(headroom_mem.OutOfMemoryError):
        pool.alloc_buffer((8,), "uint8", "local")


@pytest.mark.parametrize(
    "alias, canonical",
    [("bool_", "bool"), ("u8", "uint8"), ("i8", "int8"), ("short", "int16"), ("int", "int32"),
     ("long", "int64"), ("half", "float16"), ("bf16", "bfloat16"), ("float", "float32"),
     ("double", "float64"), ("torch.bfloat16", "bfloat16")],
)
def test_dtype_aliases(host_pool, alias, canonical):
    assert host_pool.alloc_buffer((2,), alias).dtype == canonical


def test_buffer_protocol_formats_map_to_dtypes(host_pool):
    import array

    buf = host_pool.alloc_buffer((3,), "int64")
    buf.copy_from_host(array.array("q", [1, -2, 3]))
    assert list(buf.to_host()) == [1, -2, 3]
    buf.copy_from_host(bytes(24))  # raw bytes fit any dtype
    assert list(buf.to_host()) == [0, 0, 0]
    with pytest.raises((TypeError, ValueError)):
        buf.copy_from_host(array.array("d", [1.0, 2.0, 3.0]))  # float64 into int64
    with pytest.raises((TypeError, ValueError)):
        host_pool.alloc_buffer((3,), "int16").copy_from_host(array.array("H", [1, 2, 3]))


def test_out_of_memory_falls_back_to_the_first_shape_that_fits(sim_pool):
    held = sim_pool.alloc_buffer((40 << 20,), "uint8")
    buf = sim_pool.alloc_buffer_with_fallback([(64, 1 << 20), (32, 1 << 20), (16, 1 << 20)], "uint8")
    assert buf.shape == (16, 1 << 20), "64 MiB and 32 MiB do not fit beside 40 MiB in 64 MiB"
    with pytest.raises(headroom_mem.OutOfMemoryError) as caught:
        sim_pool.alloc_buffer_with_fallback([(64 << 20,), (32 << 20,)], "uint8")
    assert caught.value.requested == 32 << 20, "the last shape's error is raised"
    with pytest.raises(ValueError, match="at least one shape"):
        sim_pool.alloc_buffer_with_fallback([], "uint8")
    assert held.nbytes == 40 << 20
