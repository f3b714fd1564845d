// Register-blocked SGEMM, C = A * B, row-major f32 (A: M x K, B: K x N, C: M x N).
//
// A work-group of WGN x WGM work-items computes a BM x BN tile of C (BM = WGM * TM,
// BN = WGN * TN * VW). Each work-item keeps a TM x (TN * VW) block of it in registers: TM rows
// (ty, ty + WGM, ...) by TN vectors of VW adjacent columns, the vectors of neighbouring
// work-items adjacent, so that they read neighbouring addresses of B and write neighbouring
// addresses of C. It walks K in steps of TK. Vectors (float2 .. float16) are what a CPU runtime
// turns into SIMD within one work-item; GPUs want VW small and the work-group wide.
//
// Knobs (-D):
//   WGM, WGN  work-group shape (rows, columns of work-items)
//   TM, TN    rows and column vectors per work-item (the register tile)
//   VW        vector width along N (1, 2, 4, 8, 16)
//   TK        K step: elements of K staged / read per step
//   LA, LB    1: stage the A (B) tile of each K step in local memory, shared by the work-group;
//             0: read it from global memory directly (caches do the sharing)
//   PAD       extra elements per local-memory row (0 or 1), against bank conflicts
//
// Edges: reads past M, N or K are zero and stores are bounds-checked, so any sizes work; tiles
// wholly inside take a path without checks.

#define BM (WGM * TM)
#define BN (WGN * TN * VW)
#define NT (WGM * WGN)
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#if VW == 1
typedef float floatv;
#define VLOAD(p) (*(p))
#define VSTORE(v, p) (*(p) = (v))
#else
typedef CAT(float, VW) floatv;
#define VLOAD(p) CAT(vload, VW)(0, (p))
#define VSTORE(v, p) CAT(vstore, VW)((v), 0, (p))
#endif

// First column (within the tile) of vector j of work-item tx.
inline int ColOf(int tx, int j) { return (j * WGN + tx) * VW; }

// A vector of B's row kk from tile column n; CHECK: elements past N or K are zero.
#if LB
#define LOAD_B(CHECK, n, kk) VLOAD(&Bs[k][n])
#else
#define LOAD_B(CHECK, n, kk) (CHECK ? LoadEdge(B, (kk) * N + col0 + (n), (kk) < K ? N - col0 - (n) : 0) \
                                    : VLOAD(B + (kk) * N + col0 + (n)))
#endif
#if LA
#define LOAD_A(CHECK, m, kk) As[k][m]
#else
#define LOAD_A(CHECK, m, kk) \
  ((!(CHECK) || (row0 + (m) < M && (kk) < K)) ? A[(row0 + (m)) * K + (kk)] : 0.0f)
#endif

// Up to VW elements from p[off], the first `valid` of them; zeros after.
inline floatv LoadEdge(__global const float* p, int off, int valid) {
  float t[VW];
  for (int e = 0; e < VW; ++e) t[e] = e < valid ? p[off + e] : 0.0f;
  return VLOAD(t);
}

#define STEP(CHECK)                                                            \
  for (int k = 0; k < TK; ++k) {                                               \
    const int kk = k0 + k;                                                     \
    floatv b[TN];                                                              \
    for (int j = 0; j < TN; ++j) b[j] = LOAD_B(CHECK, ColOf(tx, j), kk);       \
    for (int i = 0; i < TM; ++i) {                                             \
      const floatv a = (floatv)(LOAD_A(CHECK, ty + i * WGM, kk));              \
      for (int j = 0; j < TN; ++j) acc[i][j] = mad(a, b[j], acc[i][j]);        \
    }                                                                          \
  }

__kernel __attribute__((reqd_work_group_size(WGN, WGM, 1)))
void matmul(__global const float* restrict A, __global const float* restrict B,
            __global float* restrict C, const int M, const int N, const int K) {
  const int tx = get_local_id(0);
  const int ty = get_local_id(1);
  const int row0 = get_group_id(1) * BM;
  const int col0 = get_group_id(0) * BN;
  const bool inside = row0 + BM <= M && col0 + BN <= N;  // the whole tile of C is in range
#if LA
  __local float As[TK][BM + PAD];  // transposed: As[k][m]
#endif
#if LB
  __local float Bs[TK][BN + PAD * VW];
#endif
#if LA || LB
  const int tid = ty * WGN + tx;
#endif

  floatv acc[TM][TN];
  for (int i = 0; i < TM; ++i)
    for (int j = 0; j < TN; ++j) acc[i][j] = (floatv)(0.0f);

  for (int k0 = 0; k0 < K; k0 += TK) {
#if LA
    for (int idx = tid; idx < BM * TK; idx += NT) {
      const int m = idx / TK, k = idx % TK;  // consecutive work-items: consecutive k of a row of A
      const int r = row0 + m, kk = k0 + k;
      As[k][m] = (r < M && kk < K) ? A[r * K + kk] : 0.0f;
    }
#endif
#if LB
    for (int idx = tid; idx < TK * BN; idx += NT) {
      const int k = idx / BN, n = idx % BN;  // consecutive work-items: consecutive columns of B
      const int kk = k0 + k, c = col0 + n;
      Bs[k][n] = (kk < K && c < N) ? B[kk * N + c] : 0.0f;
    }
#endif
#if LA || LB
    barrier(CLK_LOCAL_MEM_FENCE);
#endif
    if (inside && k0 + TK <= K) {
      STEP(0)
    } else {
      STEP(1)
    }
#if LA || LB
    barrier(CLK_LOCAL_MEM_FENCE);
#endif
  }

  for (int i = 0; i < TM; ++i) {
    const int r = row0 + ty + i * WGM;
    if (r >= M) continue;
    for (int j = 0; j < TN; ++j) {
      const int c = col0 + ColOf(tx, j);
      if (inside) {
        VSTORE(acc[i][j], C + r * N + c);
      } else {
        float t[VW];
        VSTORE(acc[i][j], t);
        for (int e = 0; e < VW && c + e < N; ++e) C[r * N + c + e] = t[e];
      }
    }
  }
}
