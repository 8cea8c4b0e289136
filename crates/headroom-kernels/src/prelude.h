/* headroom kernel prelude: lets clang compile CUDA and HIP kernels to device code without a
 * vendor SDK (-nocudainc/-nogpuinc). Shipped by headroom-kernels and passed with -include. */
#ifndef HEADROOM_KERNEL_PRELUDE_H
#define HEADROOM_KERNEL_PRELUDE_H

#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __host__ __attribute__((host))
#define __shared__ __attribute__((shared))
#define __constant__ __attribute__((constant))
#define __launch_bounds__(...) __attribute__((launch_bounds(__VA_ARGS__)))

#if defined(__HIP__)
struct __headroom_dim3 { unsigned x, y, z; };
#define threadIdx (__headroom_dim3{__builtin_amdgcn_workitem_id_x(), __builtin_amdgcn_workitem_id_y(), __builtin_amdgcn_workitem_id_z()})
#define blockIdx (__headroom_dim3{__builtin_amdgcn_workgroup_id_x(), __builtin_amdgcn_workgroup_id_y(), __builtin_amdgcn_workgroup_id_z()})
#define blockDim (__headroom_dim3{__builtin_amdgcn_workgroup_size_x(), __builtin_amdgcn_workgroup_size_y(), __builtin_amdgcn_workgroup_size_z()})
#define __syncthreads() __builtin_amdgcn_s_barrier()
#elif defined(__CUDA__)
#include <__clang_cuda_builtin_vars.h>
/* The fast-math intrinsics kernels use most, without libdevice. */
static __device__ inline float __expf(float x) { return __nvvm_ex2_approx_f(x * 1.4426950408889634f); }
#endif

#endif
