// Two-pass sum of x[0 .. N-1] into out[0]; deterministic (no atomics).
//
// Pass 1, reduce_partial: block g sums the BLOCK * ITEMS consecutive elements starting at
//   g * BLOCK * ITEMS into partial[g] (G = ceil_div(N, BLOCK * ITEMS) blocks). A thread adds
//   ITEMS elements spaced BLOCK apart (so a warp reads contiguous memory); the block is combined
//   with warp shuffles and then across warps through shared memory.
// Pass 2, reduce_final: one block of BLOCK threads sums the G partials the same way.
// `partial` is a scratch buffer of G floats declared in the launch plan.
//
// Knobs (-D):
//   BLOCK  block size of both passes; a multiple of 32, at most 1024
//   ITEMS  elements summed per thread in pass 1 (more work per thread, fewer partials)

#define NWARPS (BLOCK / 32)

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Block-wide sum; the result is valid in thread 0.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float sh[NWARPS];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  v = 0.0f;
  if (warp == 0) {
    v = lane < NWARPS ? sh[lane] : 0.0f;
    v = warp_sum(v);
  }
  return v;
}

extern "C" __global__ void __launch_bounds__(BLOCK)
reduce_partial(const float* __restrict__ x, float* __restrict__ partial, const int N) {
  const int base = blockIdx.x * (BLOCK * ITEMS) + threadIdx.x;
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int idx = base + i * BLOCK;
    if (idx < N) s += x[idx];
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

extern "C" __global__ void __launch_bounds__(BLOCK)
reduce_final(const float* __restrict__ partial, float* __restrict__ out, const int G) {
  float s = 0.0f;
  for (int i = threadIdx.x; i < G; i += BLOCK) s += partial[i];
  s = block_sum(s);
  if (threadIdx.x == 0) out[0] = s;
}
