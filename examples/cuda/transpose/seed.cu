// Tiled transpose through shared memory: x is R x C, y is C x R (row-major f32).
//
// A block of TILE x ROWS threads moves one TILE x TILE tile. It reads the tile from x row by row
// (threads along x read consecutive columns: coalesced), stores it in shared memory, then writes
// the transposed tile to y row by row (again coalesced). Each thread copies TILE / ROWS elements
// in each phase.
//
// Knobs (-D):
//   TILE  side of the tile (16, 32, 64)
//   ROWS  threads along the tile's second dimension; divides TILE
//   PAD   extra column per shared-memory row (0 or 1); 1 makes the column-wise reads of the tile
//         hit different banks
//
// Edges: loads and stores are bounds-checked, so any R and C work.

extern "C" __global__ void __launch_bounds__(TILE * ROWS)
transpose(const float* __restrict__ x, float* __restrict__ y, const int R, const int C) {
  __shared__ float tile[TILE][TILE + PAD];
  const int tx = threadIdx.x;
  const int ty = threadIdx.y;
  const int c0 = blockIdx.x * TILE;  // first column of x in this tile
  const int r0 = blockIdx.y * TILE;  // first row of x in this tile

  // Load: tile[j][tx] = x[r0 + j][c0 + tx].
  const int c = c0 + tx;
#pragma unroll
  for (int j = ty; j < TILE; j += ROWS) {
    const int r = r0 + j;
    if (r < R && c < C) tile[j][tx] = x[r * C + c];
  }
  __syncthreads();

  // Store: y[c0 + j][r0 + tx] = x[r0 + tx][c0 + j] = tile[tx][j].
  const int yc = r0 + tx;  // column of y = row of x
#pragma unroll
  for (int j = ty; j < TILE; j += ROWS) {
    const int yr = c0 + j;  // row of y = column of x
    if (yr < C && yc < R) y[yr * R + yc] = tile[tx][j];
  }
}
