// Row-wise softmax, one block per row (grid R, block BLOCK).
//
// Passes over the row: its maximum and the sum of exp(x - max), then the normalised output. With
// ONLINE=1 the first two are one pass (a running maximum rescales the running sum), so the row is
// read twice instead of three times. Each pass strides over the row in steps of
// BLOCK * ITEMS * VW; a thread handles ITEMS vectors of VW elements per step, the vectors of
// neighbouring threads adjacent (a warp reads contiguous memory). Per-thread results are combined
// with warp shuffles, then across warps through shared memory.
//
// Knobs (-D):
//   BLOCK  threads per row = block size; a multiple of 32, at most 1024
//   ITEMS  vectors each thread handles per loop step (independent loads in flight)
//   VW     elements per vector: 1, 2 (float2) or 4 (float4); rows whose length is not a multiple
//          of VW (unaligned) and a row's last partial vector go element-wise
//   ONLINE 1: maximum and sum in one pass; 0: in two

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

// A running sum of exp(x - m) moved to the maximum m2 >= m (an empty one stays 0, also at -inf).
__device__ __forceinline__ float Rescale(float s, float m, float m2) { return s == 0.0f ? 0.0f : s * expf(m - m2); }

// Warp-wide (maximum, sum of exp(x - maximum)) of every thread's pair.
__device__ __forceinline__ void warp_ms(float& m, float& s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
    const float s2 = __shfl_xor_sync(0xffffffffu, s, o);
    const float mm = fmaxf(m, m2);
    s = Rescale(s, m, mm) + Rescale(s2, m2, mm);
    m = mm;
  }
}

// Block-wide max / sum / pair; every thread gets the result. `sh` holds 2 * NWARPS floats.
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

__device__ __forceinline__ void block_ms(float& m, float& s, float* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  warp_ms(m, s);
  if (lane == 0) {
    sh[warp] = m;
    sh[NWARPS + warp] = s;
  }
  __syncthreads();
  m = lane < NWARPS ? sh[lane] : -__int_as_float(0x7f800000);
  s = lane < NWARPS ? sh[NWARPS + lane] : 0.0f;
  warp_ms(m, s);
  __syncthreads();
}

// VW floats from p (aligned to VW floats) into v, and back.
__device__ __forceinline__ void LoadVec(const float* p, float* v) {
#if VW == 4
  const float4 t = *reinterpret_cast<const float4*>(p);
  v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
#elif VW == 2
  const float2 t = *reinterpret_cast<const float2*>(p);
  v[0] = t.x; v[1] = t.y;
#else
  v[0] = *p;
#endif
}

__device__ __forceinline__ void StoreVec(const float* v, float* p) {
#if VW == 4
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
#elif VW == 2
  *reinterpret_cast<float2*>(p) = make_float2(v[0], v[1]);
#else
  *p = v[0];
#endif
}

// For every element of the row: FULL(c) for a whole aligned vector at c, PART(e) for one element
// otherwise.
#define FOR_ROW(FULL, PART)                                        \
  for (int base = 0; base < C; base += BLOCK * ITEMS * VW) {       \
    _Pragma("unroll") for (int i = 0; i < ITEMS; ++i) {            \
      const int c = base + (i * BLOCK + tid) * VW;                 \
      if (vec_rows && c + VW <= C) {                               \
        FULL(c)                                                    \
      } else {                                                     \
        for (int e = c; e < C && e < c + VW; ++e) { PART(e) }      \
      }                                                            \
    }                                                              \
  }

extern "C" __global__ void __launch_bounds__(BLOCK)
softmax(const float* __restrict__ x, float* __restrict__ y, const int R, const int C) {
  __shared__ float sh[2 * NWARPS];
  const int r = blockIdx.x;
  const int tid = threadIdx.x;
  const float* xr = x + (size_t)r * C;
  float* yr = y + (size_t)r * C;
  const bool vec_rows = C % VW == 0;  // every row starts aligned

  float m = -__int_as_float(0x7f800000);  // -infinity
  float sum = 0.0f;
#if ONLINE
#define FULL_MS(c) { float v[VW]; LoadVec(xr + (c), v); float vm = v[0];                  \
                     for (int e = 1; e < VW; ++e) vm = fmaxf(vm, v[e]);                  \
                     const float m2 = fmaxf(m, vm); float t = 0.0f;                      \
                     for (int e = 0; e < VW; ++e) t += expf(v[e] - m2);                  \
                     sum = Rescale(sum, m, m2) + t; m = m2; }
#define PART_MS(e) { const float m2 = fmaxf(m, xr[e]); sum = Rescale(sum, m, m2) + expf(xr[e] - m2); m = m2; }
  FOR_ROW(FULL_MS, PART_MS)
  block_ms(m, sum, sh);
#else
  // Pass 1: row maximum.
#define FULL_M(c) { float v[VW]; LoadVec(xr + (c), v); for (int e = 0; e < VW; ++e) m = fmaxf(m, v[e]); }
#define PART_M(e) { m = fmaxf(m, xr[e]); }
  FOR_ROW(FULL_M, PART_M)
  m = block_max(m, sh);
  // Pass 2: sum of exp(x - max).
#define FULL_S(c) { float v[VW]; LoadVec(xr + (c), v); for (int e = 0; e < VW; ++e) sum += expf(v[e] - m); }
#define PART_S(e) { sum += expf(xr[e] - m); }
  FOR_ROW(FULL_S, PART_S)
  sum = block_sum(sum, sh);
#endif
  const float inv = 1.0f / sum;

  // Last pass: normalise.
#define FULL_Y(c) { float v[VW]; LoadVec(xr + (c), v); for (int e = 0; e < VW; ++e) v[e] = expf(v[e] - m) * inv; \
                    StoreVec(v, yr + (c)); }
#define PART_Y(e) { yr[e] = expf(xr[e] - m) * inv; }
  FOR_ROW(FULL_Y, PART_Y)
}
