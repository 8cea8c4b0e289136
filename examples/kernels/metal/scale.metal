#include <metal_stdlib>
using namespace metal;

kernel void scale(device float *x [[buffer(0)]], constant float &s [[buffer(1)]], uint i [[thread_position_in_grid]]) {
  x[i] *= s;
}
