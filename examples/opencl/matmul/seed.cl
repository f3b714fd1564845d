// Tiled SGEMM, C = A * B, row-major f32 (A: M x K, B: K x N, C: M x N).
//
// A work-group computes one TILE x TILE tile of C. It walks K in steps of TILE, staging a
// TILE x TILE tile of A and of B in local memory, then accumulates from local memory.
// Work-group shape is (TILE / WPT, TILE): each work-item owns one row of the tile and WPT columns
// of it, spaced TILE / WPT apart so neighbouring work-items touch neighbouring addresses.
//
// Knobs (-D):
//   TILE  side of the C tile and of the staged A/B tiles (8, 16, 32)
//   WPT   work per thread: outputs per work-item along the row; must divide TILE
//   PAD   extra columns per local-memory row (0 or 1) to spread accesses over banks
//
// Edges: tiles are zero-filled past M, N and K and stores are bounds-checked, so any sizes work.

#define RTS (TILE / WPT)  // work-items along a tile row

__kernel __attribute__((reqd_work_group_size(RTS, TILE, 1)))
void matmul(__global const float* A, __global const float* B, __global float* C,
            const int M, const int N, const int K) {
  const int tx = get_local_id(0);  // 0 .. RTS-1
  const int ty = get_local_id(1);  // 0 .. TILE-1
  const int row = get_group_id(1) * TILE + ty;
  const int col0 = get_group_id(0) * TILE;

  __local float As[TILE][TILE + PAD];
  __local float Bs[TILE][TILE + PAD];

  float acc[WPT];
  for (int w = 0; w < WPT; ++w) acc[w] = 0.0f;

  const int num_tiles = (K + TILE - 1) / TILE;
  for (int t = 0; t < num_tiles; ++t) {
    const int k0 = t * TILE;
    // Each work-item loads WPT elements of each tile.
    for (int w = 0; w < WPT; ++w) {
      const int c = tx + w * RTS;
      const int ka = k0 + c;   // column of A
      const int kb = k0 + ty;  // row of B
      const int nb = col0 + c; // column of B
      As[ty][c] = (row < M && ka < K) ? A[row * K + ka] : 0.0f;
      Bs[ty][c] = (kb < K && nb < N) ? B[kb * N + nb] : 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    for (int k = 0; k < TILE; ++k) {
      const float a = As[ty][k];
      for (int w = 0; w < WPT; ++w) acc[w] += a * Bs[k][tx + w * RTS];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }

  if (row < M) {
    for (int w = 0; w < WPT; ++w) {
      const int col = col0 + tx + w * RTS;
      if (col < N) C[row * N + col] = acc[w];
    }
  }
}
