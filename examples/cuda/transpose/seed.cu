// Tiled transpose: x is R x C, y is C x R (row-major f32). The same kernel as
// examples/opencl/transpose, in CUDA.
//
// A block of (TC / VW) x ROWS threads moves one TR x TC tile of x (TR rows, TC columns) to the
// TC x TR tile of y. Reads go along rows of x (threads along x read consecutive vectors of VW
// columns: coalesced) and writes along rows of y (consecutive runs of VW elements: coalesced).
// With LOCAL the tile passes through shared memory between the two; without it each thread
// writes what it read straight to y (strided writes, no barrier).
//
// Knobs (-D):
//   TR, TC  rows and columns of x per tile
//   ROWS    threads along y; each copies every ROWS-th row of the tile
//   VW      elements per access along a row: 1, 2 (float2) or 4 (float4)
//   LOCAL   1: stage the tile in shared memory; 0: copy directly
//   PAD     extra elements per shared-memory row (0 or 1), against bank conflicts
//
// Edges: loads and stores are bounds-checked, so any R and C work; tiles wholly inside a matrix
// whose rows are a multiple of VW long take the vector path (aligned addresses).

#define WX (TC / VW)  // threads along x

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

// This thread's VW elements of row r of x from column cx into t; returns how many lie inside x
// (a prefix). `fast`: all of them, read as one aligned vector.
__device__ __forceinline__ int ReadRow(const float* __restrict__ x, int R, int C, int r, int cx, bool fast,
                                       float* t) {
  if (fast) {
    LoadVec(x + (size_t)r * C + cx, t);
    return VW;
  }
  int n = 0;
  for (int e = 0; e < VW && r < R && cx + e < C; ++e) t[n++] = x[(size_t)r * C + cx + e];
  return n;
}

extern "C" __global__ void __launch_bounds__(WX * ROWS)
transpose(const float* __restrict__ x, float* __restrict__ y, const int R, const int C) {
  const int tx = threadIdx.x;
  const int ty = threadIdx.y;
  const int c0 = blockIdx.x * TC;  // first column of x in this tile
  const int r0 = blockIdx.y * TR;  // first row of x in this tile
  const bool inside = r0 + TR <= R && c0 + TC <= C;
  const int cx = c0 + tx * VW;  // the first of this thread's VW columns of x
  const bool fast = inside && C % VW == 0;

#if LOCAL
  __shared__ float tile[TR][TC + PAD];
  // Load: tile[j][tx * VW + e] = x[r0 + j][cx + e].
#pragma unroll
  for (int j = ty; j < TR; j += ROWS) {
    float t[VW];
    const int n = ReadRow(x, R, C, r0 + j, cx, fast, t);
    for (int e = 0; e < n; ++e) tile[j][tx * VW + e] = t[e];
  }
  __syncthreads();
  // Store: row c0 + jj of y, its columns r0 + i .. r0 + i + VW - 1 = rows of x; tile[i + e][jj].
#pragma unroll
  for (int jj = ty; jj < TC; jj += ROWS) {
    const int yr = c0 + jj;
    for (int i = tx * VW; i < TR; i += TC) {
      float t[VW];
#pragma unroll
      for (int e = 0; e < VW; ++e) t[e] = tile[i + e][jj];
      if (inside && R % VW == 0) {
        StoreVec(t, y + (size_t)yr * R + r0 + i);
      } else {
#pragma unroll
        for (int e = 0; e < VW; ++e) {
          if (yr < C && r0 + i + e < R) y[(size_t)yr * R + r0 + i + e] = t[e];
        }
      }
    }
  }
#else
  // Straight through: y[cx + e][r] = x[r][cx + e].
#pragma unroll
  for (int j = ty; j < TR; j += ROWS) {
    float t[VW];
    const int r = r0 + j;
    const int n = ReadRow(x, R, C, r, cx, fast, t);
    for (int e = 0; e < n; ++e) y[(size_t)(cx + e) * R + r] = t[e];
  }
#endif
}
