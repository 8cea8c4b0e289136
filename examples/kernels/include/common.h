// Shared between the CUDA and HIP examples.
#pragma once
#define HEADROOM_EXAMPLE_GRID_STRIDE(i, n) \
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += blockDim.x * 128)
