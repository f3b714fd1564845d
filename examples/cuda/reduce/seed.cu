// Two-pass sum of x[0 .. N-1] into out[0]; deterministic (no atomics).
//
// Pass 1, reduce_partial: block g sums the BLOCK * ITEMS * VW consecutive elements starting at
//   g * BLOCK * ITEMS * VW into partial[g] (G = ceil_div(N, BLOCK * ITEMS * VW) blocks). A thread
//   adds ITEMS vectors of VW elements spaced BLOCK vectors apart (so a warp reads contiguous
//   memory) into ACC independent accumulators (more additions in flight); the block is combined
//   with warp shuffles and then across warps through shared memory.
// Pass 2, reduce_final: one block of BLOCK threads sums the G partials the same way.
// `partial` is a scratch buffer of G floats declared in the launch plan.
//
// Knobs (-D):
//   BLOCK  block size of both passes; a multiple of 32, at most 1024
//   ITEMS  vectors summed per thread in pass 1 (more work per thread, fewer partials)
//   VW     elements per vector: 1, 2 (float2 loads) or 4 (float4)
//   ACC    independent accumulators per thread (1, 2, 4); at most ITEMS

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

// The sum of the VW elements at x[idx ..] (idx a multiple of VW), those past N counting 0.
__device__ __forceinline__ float VecSum(const float* __restrict__ x, const int idx, const int N) {
  if (idx + VW <= N) {
#if VW == 4
    const float4 t = *reinterpret_cast<const float4*>(x + idx);
    return (t.x + t.y) + (t.z + t.w);
#elif VW == 2
    const float2 t = *reinterpret_cast<const float2*>(x + idx);
    return t.x + t.y;
#else
    return x[idx];
#endif
  }
  float s = 0.0f;
  for (int e = 0; e < VW && idx + e < N; ++e) s += x[idx + e];
  return s;
}

extern "C" __global__ void __launch_bounds__(BLOCK)
reduce_partial(const float* __restrict__ x, float* __restrict__ partial, const int N) {
  const int base = blockIdx.x * (BLOCK * ITEMS) + threadIdx.x;  // in vectors
  float acc[ACC];
#pragma unroll
  for (int a = 0; a < ACC; ++a) acc[a] = 0.0f;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int idx = (base + i * BLOCK) * VW;
    if (idx < N) acc[i % ACC] += VecSum(x, idx, N);
  }
  float s = 0.0f;
#pragma unroll
  for (int a = 0; a < ACC; ++a) s += acc[a];
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
