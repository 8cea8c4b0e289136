"""DLPack: NumPy and CPU torch share a buffer's memory without a copy, and the memory lives
as long as any consumer holds it, even after the buffer was freed."""

import gc

import numpy as np
import pytest

import headroom_mem
from conftest import SIM_64M


def torch_or_skip():
    return pytest.importorskip("torch", reason="torch is not installed; the torch DLPack tests need it")


def test_numpy_shares_memory_both_ways(host_pool):
    buf = host_pool.alloc_buffer((4, 8), "float32")
    buf.copy_from_host(np.arange(32, dtype=np.float32).reshape(4, 8))
    array = np.from_dlpack(buf)
    assert array.shape == (4, 8) and array.dtype == np.float32
    assert array.ctypes.data == buf.data_ptr, "no copy"
    array[2, 3] = -7.0
    assert buf.to_host()[2, 3] == -7.0
    buf.copy_from_host(np.ones((4, 8), np.float32))
    assert array.sum() == 32.0


@pytest.mark.parametrize(
    "dtype", ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64"]
)
def test_numpy_reads_every_dtype(host_pool, dtype):
    buf = host_pool.alloc_buffer(3, dtype)
    assert np.from_dlpack(buf).dtype == np.dtype(dtype)


def test_versioned_and_legacy_capsules(host_pool):
    buf = host_pool.alloc_buffer(2, "float32")
    assert buf.__dlpack_device__() == (1, 0)
    legacy = buf.__dlpack__()
    versioned = buf.__dlpack__(max_version=(1, 0))
    assert "dltensor" in repr(legacy) and "dltensor_versioned" not in repr(legacy)
    assert "dltensor_versioned" in repr(versioned)
    del legacy, versioned  # unconsumed capsules delete their tensors
    gc.collect()
    host_pool.free(buf)
    assert host_pool.memory_allocated() == 0


class LegacyOnly:
    """A producer as DLPack 0.x wrote them: `__dlpack__` without max_version."""

    def __init__(self, buf):
        self.buf = buf

    def __dlpack__(self, stream=None, **_):
        return self.buf.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self.buf.__dlpack_device__()


def test_legacy_capsules_are_consumed_and_deleted(host_pool):
    buf = host_pool.alloc_buffer(16, "int16")
    buf.copy_from_host(np.arange(16, dtype=np.int16))
    array = np.from_dlpack(LegacyOnly(buf))
    assert array.ctypes.data == buf.data_ptr and array[15] == 15
    host_pool.free(buf)
    assert host_pool.memory_allocated() == 512
    del array
    gc.collect()
    assert host_pool.memory_allocated() == 0


def test_copy_request_exports_a_copy(host_pool):
    buf = host_pool.alloc_buffer(4, "int32")
    buf.copy_from_host(np.arange(4, dtype=np.int32))
    copied = np.from_dlpack(buf, copy=True)
    assert copied.ctypes.data != buf.data_ptr
    copied[0] = 99
    assert buf.to_host()[0] == 0


def test_wrong_device_is_refused(host_pool):
    buf = host_pool.alloc_buffer(4, "int32")
    with pytest.raises(BufferError, match="cannot be exported to"):
        buf.__dlpack__(dl_device=(2, 0))


def test_simulated_memory_is_not_exported():
    buf = headroom_mem.MemoryPool(SIM_64M).alloc_buffer(4, "float32")
    with pytest.raises(BufferError, match="simulated addresses"):
        np.from_dlpack(buf)


def test_a_consumer_keeps_freed_memory_alive(host_pool):
    buf = host_pool.alloc_buffer(1024, "float32")
    buf.copy_from_host(np.full(1024, 3.0, np.float32))
    array = np.from_dlpack(buf)
    host_pool.free(buf)
    assert buf.freed
    assert host_pool.memory_allocated() == 4096, "NumPy still holds the memory"
    # Nothing else may be placed in it while NumPy reads it.
    other = host_pool.alloc_buffer(1024, "float32")
    other.copy_from_host(np.zeros(1024, np.float32))
    assert array.sum() == 3.0 * 1024
    del array
    gc.collect()
    assert host_pool.memory_allocated() == 4096, "only the other buffer is left"


def test_a_consumer_keeps_the_pool_alive():
    pool = headroom_mem.MemoryPool("host")
    buf = pool.alloc_buffer(256, "int64")
    buf.copy_from_host(np.arange(256, dtype=np.int64))
    array = np.from_dlpack(buf)
    del pool, buf
    gc.collect()
    assert array.sum() == sum(range(256))


def test_torch_shares_memory_both_ways(host_pool):
    torch = torch_or_skip()
    buf = host_pool.alloc_buffer((4, 8), "float32")
    buf.copy_from_host(np.zeros((4, 8), np.float32))
    tensor = torch.from_dlpack(buf)
    assert tensor.shape == (4, 8) and tensor.dtype == torch.float32
    assert tensor.data_ptr() == buf.data_ptr, "no copy"
    tensor[1, 2] = 5.0
    assert buf.to_host()[1, 2] == 5.0
    buf.copy_from_host(np.full((4, 8), 2.0, np.float32))
    assert tensor.sum().item() == 64.0
    view = np.from_dlpack(buf)
    tensor[0, 0] = -1.0
    assert view[0, 0] == -1.0, "torch and NumPy see the same bytes"


def test_torch_reads_bfloat16_and_keeps_memory_alive(host_pool):
    torch = torch_or_skip()
    buf = host_pool.alloc_buffer(8, "bfloat16")
    tensor = torch.from_dlpack(buf)
    assert tensor.dtype == torch.bfloat16
    tensor.fill_(1.5)
    assert buf.to_host() == torch.full((8,), 1.5, dtype=torch.bfloat16).view(torch.uint8).numpy().tobytes()
    host_pool.free(buf)
    assert host_pool.memory_allocated() == 512
    tensor.add_(1.0)
    del tensor
    gc.collect()
    assert host_pool.memory_allocated() == 0


def test_torch_tensors_and_dtypes_are_accepted(host_pool):
    torch = torch_or_skip()
    buf = host_pool.alloc_buffer(6, torch.int16)
    assert buf.dtype == "int16"
    buf.copy_from_host(torch.arange(6, dtype=torch.int16))
    assert list(buf.to_host()) == list(range(6))


def test_host_copies_read_and_write_arrays_in_place(pool):
    source = np.arange(64, dtype=np.float32)
    buf = pool.alloc_buffer(64, "float32")
    buf.copy_from_host(np.frombuffer(source.tobytes(), np.float32))  # a read-only array
    out = np.zeros(64, np.float32)
    assert buf.to_host(out=out) is out
    assert np.array_equal(out, source)
    raw = np.zeros(256, np.uint8)
    buf.to_host(out=raw)  # bytes fill any dtype
    assert raw.view(np.float32)[63] == 63.0
    buf.copy_from_host(b"\0" * 256)
    assert not buf.to_host().any()


def test_host_copy_targets_are_checked(host_pool):
    buf = host_pool.alloc_buffer(8, "float32")
    with pytest.raises(ValueError, match="read-only|readonly"):
        buf.to_host(out=np.frombuffer(bytes(32), np.float32))
    with pytest.raises(ValueError, match="does not match buffer dtype F32"):
        buf.to_host(out=np.zeros(8, np.int32))
    with pytest.raises(ValueError, match="destination has 16 bytes, source 32"):
        buf.to_host(out=np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="not C-contiguous"):
        buf.to_host(out=np.zeros((8, 2), np.float32)[:, 0])
    with pytest.raises(TypeError, match="out= takes a writable NumPy array"):
        buf.to_host(out=bytearray(32))


def test_torch_cpu_tensors_are_copied_in_place(host_pool):
    torch = torch_or_skip()
    buf = host_pool.alloc_buffer((2, 8), "bfloat16")
    buf.copy_from_host(torch.full((2, 8), 2.5, dtype=torch.bfloat16))
    out = torch.empty((2, 8), dtype=torch.bfloat16)
    assert buf.to_host(out=out) is out
    assert out.eq(2.5).all()
    with pytest.raises(ValueError, match="not C-contiguous"):
        buf.copy_from_host(torch.zeros((8, 2), dtype=torch.bfloat16).t())


class ReadOnlyBeforeDLPack1(bytearray):
    """What NumPy before 2.1 does with a read-only array: refuses the DLPack export."""

    def __dlpack__(self, **_):
        raise BufferError("Cannot export readonly array since signalling readonly is unsupported by DLPack")

    def __dlpack_device__(self):
        return (1, 0)


def test_a_producer_that_refuses_dlpack_is_read_through_the_buffer_protocol(host_pool):
    buf = host_pool.alloc_buffer(16, "uint8")
    buf.copy_from_host(ReadOnlyBeforeDLPack1(range(16)))
    assert list(buf.to_host()) == list(range(16))
