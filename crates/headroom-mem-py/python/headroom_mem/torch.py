"""PyTorch on headroom-mem's memory.

``MemPool(device)`` returns a ``torch.cuda.MemPool`` whose segments PyTorch's caching
allocator takes from headroom-mem (through ``CUDAPluggableAllocator``), so
``torch.cuda.use_mem_pool``, ``torch.cuda.memory_stats()`` and ``torch.cuda.memory._snapshot()``
keep working. On top of what PyTorch offers:

* ``tag(name)``: allocations made inside carry the tag;
* ``offload(name)`` / ``restore(name)``: a tag's memory moves to pinned host memory and comes
  back at the same addresses (tensors keep their ``data_ptr``), vLLM's "sleep" and "wake";
* ``memory_stats()``: headroom-mem's figures for what PyTorch reserved, by tag, which
  survive a pluggable allocator (PyTorch's own stats do not see one installed globally);
* ``MemPool(...).release()``: hands the pool's free segments back to the driver while it
  still holds tensors, which a plain MemPool never does (pytorch#159674);
* ``release()``: hands every segment PyTorch may release back to the driver at once;
* ``last_failure()``: why a request could not be served, with the pool's fragmentation.

``use_as_default_allocator()`` makes headroom-mem PyTorch's whole allocator, for every
tensor of the process; it is opt-in because of what it loses (see its docstring).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Iterator, Optional, Union

from . import _native

ALLOC_FN = "headroom_mem_torch_alloc"
FREE_FN = "headroom_mem_torch_free"

DeviceLike = Union[None, int, str, "torch.device"]  # noqa: F821


def _torch():
    try:
        import torch
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            "headroom_mem.torch needs PyTorch: pip install torch"
        ) from error
    return torch


def _index(device: DeviceLike) -> int:
    """The CUDA device index PyTorch will pass to the allocator functions."""
    torch = _torch()
    if device is None:
        # Asking for the current device initialises CUDA, and with it PyTorch's allocator,
        # which then cannot be swapped: before initialisation the current device is 0.
        return torch.cuda.current_device() if torch.cuda.is_initialized() else 0
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(
            f"device {str(device)!r} is not a CUDA device; headroom_mem.torch serves "
            "torch.cuda allocations (give 'cuda' or 'cuda:N')"
        )
    return device.index if device.index is not None else torch.cuda.current_device()


def configure(index: int, device: str, caching: bool = False) -> None:
    """Serves PyTorch's requests for CUDA device ``index`` from headroom-mem ``device``
    (``"cuda:N"``; ``"host"`` exercises the allocator functions without a GPU). ``caching``
    is for the whole-allocator mode; under a MemPool, PyTorch caches."""
    _native.plug_configure(index, device, caching)


def allocator(device: DeviceLike = None, caching: bool = False):
    """A ``torch.cuda.memory.CUDAPluggableAllocator`` over headroom-mem for ``device``."""
    torch = _torch()
    index = _index(device)
    configure(index, f"cuda:{index}", caching)
    return torch.cuda.memory.CUDAPluggableAllocator(_native.__file__, ALLOC_FN, FREE_FN)


def MemPool(device: DeviceLike = None, use_on_oom: bool = False):  # noqa: N802 - mirrors torch
    """A ``torch.cuda.MemPool`` whose segments come from headroom-mem.

    Use it as any MemPool::

        weights = headroom_mem.torch.MemPool()
        with torch.cuda.use_mem_pool(weights), headroom_mem.torch.tag("weights"):
            model = Model().cuda()

    A tag marks the segments PyTorch asked for while it was set, and PyTorch may place any
    later tensor of the same pool in their free space: give each tag its own MemPool.

    Unlike a plain MemPool, its free segments can go back to the driver while it still
    holds tensors: see ``release()`` on the returned pool.
    """
    index = _index(device)
    return _releasable_pool_class()(allocator(index).allocator(), index, use_on_oom)


@functools.lru_cache(maxsize=None)
def _releasable_pool_class():
    """The MemPool subclass, made on first use so that importing this module needs no torch."""
    torch = _torch()

    class ReleasableMemPool(torch.cuda.MemPool):
        """A ``torch.cuda.MemPool`` that hands its free segments back while in use.

        PyTorch releases a pool's cached segments only once no MemPool object refers to it
        (pytorch#159674), so a pool the program keeps only grows. This one routes its
        allocations to a generation: an inner MemPool that ``id`` names, which
        ``torch.cuda.use_mem_pool`` and ``snapshot()`` use. ``release()`` starts a new
        generation and drops the old one, whose free segments PyTorch then releases; its
        live tensors stay where they are, and their segments follow when they are freed.
        """

        def __init__(self, allocator, index, use_on_oom):
            # The pool this object itself names stays empty: `id` routes every allocation to
            # the current generation, which, unlike this object, can be dropped.
            super().__init__(allocator, use_on_oom=use_on_oom)
            self._allocator = allocator
            self._index = index
            self._use_on_oom = use_on_oom
            self._generation = self._new_generation()

        def _new_generation(self):
            return torch.cuda.MemPool(self._allocator, use_on_oom=self._use_on_oom)

        @property
        def id(self):
            return self._generation.id

        def use_count(self) -> int:
            return self._generation.use_count()

        def release(self) -> int:
            """Hands the pool's free segments back to the driver now, while its tensors stay
            valid and it stays usable; returns the bytes that left headroom-mem's pool. Call
            it between ``use_mem_pool`` blocks: inside one (or while a CUDA graph holds the
            pool) it raises. It also empties PyTorch's default cache, as
            ``torch.cuda.empty_cache()`` does."""
            if self._generation.use_count() > 1:
                raise RuntimeError(
                    "MemPool.release() runs between torch.cuda.use_mem_pool blocks: this pool "
                    "is active in one, or a CUDA graph holds it; call release() after the block"
                )

            def next_generation():
                self._generation = self._new_generation()  # the old one's last reference goes
                torch.cuda.empty_cache()

            return _bytes_released(self._index, next_generation)

    return ReleasableMemPool


@contextlib.contextmanager
def tag(name: str) -> Iterator[None]:
    """Allocations this thread makes inside carry ``name``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a tag is a non-empty string, not {name!r}")
    previous = _native.plug_set_tag(name)
    try:
        yield
    finally:
        _native.plug_set_tag(previous)


def _synchronize(index: int) -> None:
    """Waits for the work queued on CUDA device ``index``; an index that is no CUDA device
    (one served by ``"host"``) has none."""
    torch = _torch()
    if torch.cuda.is_available() and 0 <= index < torch.cuda.device_count():
        torch.cuda.synchronize(index)


def offload(name: str, device: DeviceLike = None) -> int:
    """Moves every segment tagged ``name`` to pinned host memory and gives its device memory
    back; returns the bytes moved. Tensors in those segments keep their addresses but must
    not be used until ``restore(name)``."""
    index = _index(device)
    _synchronize(index)
    return _native.plug_offload(index, name)


def restore(name: str, device: DeviceLike = None) -> int:
    """Brings the segments tagged ``name`` back to the device at the same addresses; returns
    the bytes moved."""
    index = _index(device)
    moved = _native.plug_restore(index, name)
    _synchronize(index)
    return moved


def memory_stats(device: DeviceLike = None) -> dict:
    """headroom-mem's statistics of what PyTorch holds on ``device``, in PyTorch's key names,
    with ``tags.<tag>.live_bytes`` and ``tags.<tag>.offloaded_bytes`` per tag."""
    return _native.plug_memory_stats(_index(device))


def last_failure(device: DeviceLike = None) -> Optional[str]:
    """Why the last request PyTorch made on ``device`` could not be served (sizes, device
    free bytes, the pool's fragmentation), or None. PyTorch's out-of-memory error does not
    carry it."""
    return _native.plug_last_failure(_index(device))


def release(device: DeviceLike = None) -> int:
    """Hands back to the driver every free segment PyTorch lets go of (its default cache,
    and MemPools no object refers to any more) and headroom-mem's own cache (the whole
    allocator mode's); returns the bytes that left headroom-mem's pool. A MemPool still in
    use releases its free segments with its own ``release()``."""
    torch = _torch()

    def empty():
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()
        _native.plug_empty_cache(index)

    index = _index(device)
    return _bytes_released(index, empty)


def _bytes_released(index: int, empty) -> int:
    """Runs ``empty`` once the device's queued work is done; returns the bytes that left
    headroom-mem's pool for device ``index``."""
    before = memory_stats(index)["reserved_bytes.all.current"]
    _synchronize(index)
    empty()
    return before - memory_stats(index)["reserved_bytes.all.current"]


def use_as_default_allocator(device: DeviceLike = None) -> None:
    """Makes headroom-mem PyTorch's allocator for every CUDA tensor of this process.

    Opt in only knowing what it loses: it must run before the first CUDA allocation (PyTorch
    refuses to swap an allocator in use); PyTorch's caching allocator is replaced by
    headroom-mem's caching pool for every tensor; ``torch.cuda.memory_stats()``,
    ``memory_snapshot()`` and ``max_memory_allocated()`` report nothing for a pluggable
    allocator (use this module's ``memory_stats()``); CUDA graphs cannot keep private pools;
    stream-ordered reuse (``record_stream``) is not tracked, so a tensor used on a side
    stream must be synchronised before it is freed; and tags cannot be offloaded. A
    ``MemPool`` from this module keeps all of those.
    """
    torch = _torch()
    torch.cuda.memory.change_current_allocator(allocator(device, caching=True))
