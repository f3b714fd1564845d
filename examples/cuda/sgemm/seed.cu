// Register-blocked SGEMM, C = A * B, row-major f32 (A: M x K, B: K x N, C: M x N).
//
// A block of WGN x WGM threads computes a BM x BN tile of C (BM = WGM * TM, BN = WGN * TN * VW).
// Each thread keeps a TM x (TN * VW) block of it in registers: TM rows (ty, ty + WGM, ...) by TN
// vectors of VW adjacent columns, the vectors of neighbouring threads adjacent, so that a warp
// reads neighbouring addresses of B and writes neighbouring addresses of C. It walks K in steps
// of TK.
//
// Knobs (-D):
//   WGM, WGN  block shape (rows, columns of threads)
//   TM, TN    rows and column vectors per thread (the register tile)
//   VW        vector width along N: 1, 2 (float2) or 4 (float4) columns per access
//   TK        K step: elements of K staged / read per step
//   LA, LB    1: stage the A (B) tile of each K step in shared memory, shared by the block;
//             0: read it from global memory directly (the caches do the sharing)
//   PAD       extra elements per shared-memory row (0 or 1), against bank conflicts
//
// Edges: reads past M, N or K are zero and stores are bounds-checked, so any sizes work; tiles
// wholly inside take a path without checks. Vector accesses to global memory need rows whose
// length is a multiple of VW (aligned addresses); other sizes take the scalar path.

#define BM (WGM * TM)
#define BN (WGN * TN * VW)
#define NT (WGM * WGN)

// VW floats from p (aligned to VW floats) into v.
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

extern "C" __global__ void __launch_bounds__(WGM * WGN)
    matmul(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
           const int M, const int N, const int K) {
  const int tx = threadIdx.x;
  const int ty = threadIdx.y;
  const int row0 = blockIdx.y * BM;
  const int col0 = blockIdx.x * BN;
  const bool inside = row0 + BM <= M && col0 + BN <= N;  // the whole tile of C is in range
  const bool vec_rows = N % VW == 0;                      // rows of B and C start aligned
#if LA
  __shared__ float As[TK][BM + PAD];  // transposed: As[k][m]
#endif
#if LB
  __shared__ __align__(16) float Bs[TK][BN + PAD * VW];
#endif
#if LA || LB
  const int tid = ty * WGN + tx;
#endif

  float acc[TM][TN * VW];
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN * VW; ++j) acc[i][j] = 0.0f;

  for (int k0 = 0; k0 < K; k0 += TK) {
#if LA
    for (int idx = tid; idx < BM * TK; idx += NT) {
      const int m = idx / TK, k = idx % TK;  // consecutive threads: consecutive k of a row of A
      const int r = row0 + m, kk = k0 + k;
      As[k][m] = (r < M && kk < K) ? A[(size_t)r * K + kk] : 0.0f;
    }
#endif
#if LB
    for (int idx = tid; idx < TK * BN; idx += NT) {
      const int k = idx / BN, n = idx % BN;  // consecutive threads: consecutive columns of B
      const int kk = k0 + k, c = col0 + n;
      Bs[k][n] = (kk < K && c < N) ? B[(size_t)kk * N + c] : 0.0f;
    }
#endif
#if LA || LB
    __syncthreads();
#endif
    const bool full = inside && k0 + TK <= K;
#pragma unroll
    for (int k = 0; k < TK; ++k) {
      const int kk = k0 + k;
      float b[TN][VW];
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        const int n = (j * WGN + tx) * VW;
#if LB
        LoadVec(&Bs[k][n], b[j]);
#else
        if (full && vec_rows) {
          LoadVec(B + (size_t)kk * N + col0 + n, b[j]);
        } else {
#pragma unroll
          for (int e = 0; e < VW; ++e) {
            b[j][e] = (kk < K && col0 + n + e < N) ? B[(size_t)kk * N + col0 + n + e] : 0.0f;
          }
        }
#endif
      }
#pragma unroll
      for (int i = 0; i < TM; ++i) {
        const int m = ty + i * WGM;
#if LA
        const float a = As[k][m];
#else
        const float a = (full || (row0 + m < M && kk < K)) ? A[(size_t)(row0 + m) * K + kk] : 0.0f;
#endif
#pragma unroll
        for (int j = 0; j < TN; ++j)
#pragma unroll
          for (int e = 0; e < VW; ++e) acc[i][j * VW + e] = fmaf(a, b[j][e], acc[i][j * VW + e]);
      }
    }
#if LA || LB
    __syncthreads();
#endif
  }

#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int r = row0 + ty + i * WGM;
    if (r >= M) continue;
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      const int c = col0 + (j * WGN + tx) * VW;
      if (inside && vec_rows) {
        StoreVec(&acc[i][j * VW], C + (size_t)r * N + c);
      } else {
        for (int e = 0; e < VW && c + e < N; ++e) C[(size_t)r * N + c + e] = acc[i][j * VW + e];
      }
    }
  }
}
