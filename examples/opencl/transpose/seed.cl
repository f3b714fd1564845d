// Tiled transpose through local memory: x is R x C, y is C x R (row-major f32).
//
// A work-group of TILE x ROWS work-items moves one TILE x TILE tile. It reads the tile from x
// row by row (work-items along dimension 0 read consecutive columns: contiguous reads), stores it
// in local memory, then writes the transposed tile to y row by row (again contiguous writes).
// Each work-item copies TILE / ROWS elements in each phase.
//
// Knobs (-D):
//   TILE  side of the tile (8, 16, 32, 64)
//   ROWS  work-items along the tile's second dimension; divides TILE
//   PAD   extra column per local-memory row (0 or 1); 1 makes the column-wise reads of the
//         tile hit different banks
//
// Edges: loads and stores are bounds-checked, so any R and C work.

__kernel __attribute__((reqd_work_group_size(TILE, ROWS, 1)))
void transpose(__global const float* x, __global float* y, const int R, const int C) {
  __local float tile[TILE][TILE + PAD];
  const int tx = get_local_id(0);
  const int ty = get_local_id(1);
  const int c0 = get_group_id(0) * TILE;  // first column of x in this tile
  const int r0 = get_group_id(1) * TILE;  // first row of x in this tile

  // Load: tile[j][tx] = x[r0 + j][c0 + tx].
  const int c = c0 + tx;
  for (int j = ty; j < TILE; j += ROWS) {
    const int r = r0 + j;
    if (r < R && c < C) tile[j][tx] = x[r * C + c];
  }
  barrier(CLK_LOCAL_MEM_FENCE);

  // Store: y[c0 + j][r0 + tx] = x[r0 + tx][c0 + j] = tile[tx][j].
  const int yc = r0 + tx;  // column of y = row of x
  for (int j = ty; j < TILE; j += ROWS) {
    const int yr = c0 + j;  // row of y = column of x
    if (yr < C && yc < R) y[yr * R + yc] = tile[tx][j];
  }
}
