#include "common.h"

extern "C" __global__ void vector_add(float *out, const float *a, const float *b, int n) {
  HEADROOM_EXAMPLE_GRID_STRIDE(i, n) { out[i] = a[i] + b[i]; }
}
