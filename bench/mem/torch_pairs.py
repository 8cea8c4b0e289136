"""Alloc/free pairs per second through PyTorch's CUDA caching allocator from C++
(`raw_alloc`/`raw_delete`, no Python in the loop), on 1, 2, 4 and 8 threads: the baseline
that `pairs --backend cuda` is compared with.

    python3 bench/mem/torch_pairs.py [BYTES] [PAIRS_PER_THREAD]

Compiles a small C++ extension with torch.utils.cpp_extension (g++ and the CUDA headers).
"""

import sys

import torch
from torch.utils.cpp_extension import load_inline

SOURCE = r"""
#include <chrono>
#include <thread>
#include <vector>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>

double pairs_per_second(int64_t bytes, int64_t pairs, int64_t threads) {
  auto allocator = c10::cuda::CUDACachingAllocator::get();
  // Warm the cache so the loop measures cached pairs, as the Rust benchmark does.
  allocator->raw_deallocate(allocator->raw_allocate(bytes));
  auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> workers;
  for (int64_t t = 0; t < threads; ++t) {
    workers.emplace_back([=] {
      c10::cuda::CUDAGuard guard(0);
      for (int64_t i = 0; i < pairs; ++i) {
        allocator->raw_deallocate(allocator->raw_allocate(bytes));
      }
    });
  }
  for (auto& worker : workers) worker.join();
  std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  return double(pairs * threads) / elapsed.count();
}
"""


def main():
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    pairs = int(sys.argv[2]) if len(sys.argv) > 2 else 200_000
    torch.cuda.init()  # creates the caching allocator that the C++ loop asks
    module = load_inline(
        "torch_pairs", cpp_sources=SOURCE, functions=["pairs_per_second"],
        with_cuda=True, extra_cflags=["-O2"], verbose=False,
    )
    for threads in (1, 2, 4, 8):
        runs = sorted(module.pairs_per_second(size, pairs, threads) for _ in range(5))
        print(f"torch {threads} threads: {runs[2] / 1e6:.2f} M pairs/s (median of 5)", flush=True)


if __name__ == "__main__":
    main()
