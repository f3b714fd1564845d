// Row-wise softmax, one block per row (grid R, block BLOCK).
//
// Three passes over the row: row maximum, sum of exp(x - max), then the normalised output.
// Each pass strides over the row in steps of BLOCK * ITEMS; a thread handles ITEMS elements per
// step (BLOCK apart, so a warp reads contiguous memory). Per-thread partial results are combined
// with warp shuffles, then across warps through shared memory.
//
// Knobs (-D):
//   BLOCK  threads per row = block size; a multiple of 32, at most 1024
//   ITEMS  elements each thread handles per loop step (independent loads in flight)

#define NWARPS (BLOCK / 32)

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Block-wide max / sum; every thread gets the result. `sh` holds NWARPS floats.
__device__ __forceinline__ float block_max(float v, float* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_max(v);
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  v = lane < NWARPS ? sh[lane] : sh[0];
  v = warp_max(v);
  __syncthreads();  // sh may be reused by the caller
  return v;
}

__device__ __forceinline__ float block_sum(float v, float* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  v = lane < NWARPS ? sh[lane] : 0.0f;
  v = warp_sum(v);
  __syncthreads();
  return v;
}

extern "C" __global__ void __launch_bounds__(BLOCK)
softmax(const float* __restrict__ x, float* __restrict__ y, const int R, const int C) {
  __shared__ float sh[NWARPS];
  const int r = blockIdx.x;
  const int tid = threadIdx.x;
  const float* xr = x + r * C;
  float* yr = y + r * C;

  // Pass 1: row maximum.
  float m = -__int_as_float(0x7f800000);  // -infinity
  for (int base = 0; base < C; base += BLOCK * ITEMS) {
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int c = base + i * BLOCK + tid;
      if (c < C) m = fmaxf(m, xr[c]);
    }
  }
  m = block_max(m, sh);

  // Pass 2: sum of exp(x - max).
  float s = 0.0f;
  for (int base = 0; base < C; base += BLOCK * ITEMS) {
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int c = base + i * BLOCK + tid;
      if (c < C) s += expf(xr[c] - m);
    }
  }
  const float inv = 1.0f / block_sum(s, sh);

  // Pass 3: normalise.
  for (int base = 0; base < C; base += BLOCK * ITEMS) {
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int c = base + i * BLOCK + tid;
      if (c < C) yr[c] = expf(xr[c] - m) * inv;
    }
  }
}
