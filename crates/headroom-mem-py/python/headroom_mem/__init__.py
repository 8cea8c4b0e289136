"""Device memory pools for Python, from headroom-mem.

TileLang's names for buffers, PyTorch's for statistics, and DLPack for sharing memory::

    import numpy, headroom_mem

    pool = headroom_mem.MemoryPool("host")            # or "sim:datacenter", "cuda:0"
    with pool.allocate((4, 1024), "float32") as buf:  # freed at the end of the block
        buf.copy_from_host(numpy.ones((4, 1024), numpy.float32))
        view = numpy.from_dlpack(buf)                 # same memory, no copy
        print(pool.memory_stats()["allocated_bytes.all.current"])

A buffer's memory goes back to its pool when the last handle to it lets go: ``pool.free``
or the end of a ``with`` block makes the buffer itself unusable at once, while an alias or a
DLPack consumer (a NumPy array, a torch tensor) keeps the memory alive until it is gone.
"""

from ._native import (
    CUDA,
    Buffer,
    MemoryPool,
    OutOfMemoryError,
    Stage,
    TraceStage,
    Workspace,
    copy,
)

__all__ = [
    "CUDA",
    "Buffer",
    "MemoryPool",
    "OutOfMemoryError",
    "Stage",
    "TraceStage",
    "Workspace",
    "copy",
]
