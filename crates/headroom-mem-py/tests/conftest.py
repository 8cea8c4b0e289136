"""Shared fixtures: pools on the backends every machine has, and NumPy, which the
package's tests need (torch is optional: tests that need it skip with the reason)."""

import pytest

import headroom_mem

MIB = 1 << 20
# The simulated device of crates/headroom-mem/tests/pool.rs, so figures compare one to one.
SIM_64M = "sim:global=64M,shared=64K,local=4K"


@pytest.fixture(params=["host", SIM_64M])
def pool(request):
    return headroom_mem.MemoryPool(request.param)


@pytest.fixture
def host_pool():
    return headroom_mem.MemoryPool("host")


@pytest.fixture
def sim_pool():
    return headroom_mem.MemoryPool(SIM_64M)
