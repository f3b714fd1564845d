// Tiled SGEMM, C = A * B, row-major f32 (A: M x K, B: K x N, C: M x N).
//
// A block computes one TILE x TILE tile of C. It walks K in steps of TILE, staging a TILE x TILE
// tile of A and of B in shared memory, then accumulates from shared memory. The block is
// (TILE / WPT) x TILE threads: each thread owns one row of the tile and WPT columns of it,
// spaced TILE / WPT apart so that consecutive threads touch consecutive addresses.
//
// Knobs (-D):
//   TILE  side of the C tile and of the staged A/B tiles (16, 32, 64)
//   WPT   work per thread: outputs per thread along the row; must divide TILE
//   PAD   extra columns per shared-memory row (0 or 1) to spread accesses over banks
//
// Edges: tiles are zero-filled past M, N and K and stores are bounds-checked, so any sizes work.

#define RTS (TILE / WPT)  // threads along a tile row

extern "C" __global__ void __launch_bounds__(RTS * TILE)
matmul(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
       const int M, const int N, const int K) {
  const int tx = threadIdx.x;  // 0 .. RTS-1
  const int ty = threadIdx.y;  // 0 .. TILE-1
  const int row = blockIdx.y * TILE + ty;
  const int col0 = blockIdx.x * TILE;

  __shared__ float As[TILE][TILE + PAD];
  __shared__ float Bs[TILE][TILE + PAD];

  float acc[WPT];
#pragma unroll
  for (int w = 0; w < WPT; ++w) acc[w] = 0.0f;

  for (int k0 = 0; k0 < K; k0 += TILE) {
    // Each thread loads WPT elements of each tile.
#pragma unroll
    for (int w = 0; w < WPT; ++w) {
      const int c = tx + w * RTS;
      const int ka = k0 + c;    // column of A
      const int kb = k0 + ty;   // row of B
      const int nb = col0 + c;  // column of B
      As[ty][c] = (row < M && ka < K) ? A[row * K + ka] : 0.0f;
      Bs[ty][c] = (kb < K && nb < N) ? B[kb * N + nb] : 0.0f;
    }
    __syncthreads();

#pragma unroll 8
    for (int k = 0; k < TILE; ++k) {
      const float a = As[ty][k];
#pragma unroll
      for (int w = 0; w < WPT; ++w) acc[w] += a * Bs[k][tx + w * RTS];
    }
    __syncthreads();
  }

  if (row < M) {
#pragma unroll
    for (int w = 0; w < WPT; ++w) {
      const int col = col0 + tx + w * RTS;
      if (col < N) C[row * N + col] = acc[w];
    }
  }
}
