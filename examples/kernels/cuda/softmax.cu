#include "common.h"

#ifndef BLOCK
#define BLOCK 128
#endif

// One block per row; rows shorter than BLOCK.
extern "C" __global__ void softmax_rows(float *x, int cols) {
  __shared__ float row_max;
  __shared__ float row_sum;
  float *row = x + blockIdx.x * cols;
  int c = threadIdx.x;
  if (c == 0) {
    float m = row[0];
    for (int k = 1; k < cols; ++k) m = row[k] > m ? row[k] : m;
    row_max = m;
  }
  __syncthreads();
  if (c < cols) row[c] = __expf(row[c] - row_max);
  __syncthreads();
  if (c == 0) {
    float s = 0.f;
    for (int k = 0; k < cols; ++k) s += row[k];
    row_sum = s;
  }
  __syncthreads();
  if (c < cols) row[c] /= row_sum;
}
