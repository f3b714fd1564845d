// Tiled transpose: x is R x C, y is C x R (row-major f32).
//
// A work-group of (TC / VW) x ROWS work-items moves one TR x TC tile of x (TR rows, TC columns)
// to the TC x TR tile of y. Reads go along rows of x (work-items along dimension 0 read
// consecutive vectors of VW columns: contiguous) and writes along rows of y (consecutive runs of
// VW elements: contiguous). With LOCAL the tile passes through local memory between the two;
// without it each work-item writes what it read straight to y (strided writes, no barrier:
// sometimes faster on a CPU, where caches do the staging).
//
// Knobs (-D):
//   TR, TC  rows and columns of x per tile
//   ROWS    work-items along dimension 1; each copies every ROWS-th row of the tile
//   VW      elements per access along a row (1, 2, 4, 8: vload/vstore)
//   LOCAL   1: stage the tile in local memory; 0: copy directly
//   PAD     extra elements per local-memory row (0 or 1), against bank conflicts
//
// Edges: loads and stores are bounds-checked, so any R and C work; tiles wholly inside a matrix
// whose rows are a multiple of VW long take the vector path.

#define WX (TC / VW)  // work-items along dimension 0
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

// This work-item's VW elements of row r of x from column cx into t; returns how many lie inside x
// (a prefix). `fast`: all of them, read as one vector.
inline int ReadRow(__global const float* x, int R, int C, int r, int cx, bool fast, float* t) {
  if (fast) {
    VSTORE(VLOAD(x + r * C + cx), t);
    return VW;
  }
  int n = 0;
  for (int e = 0; e < VW && r < R && cx + e < C; ++e) t[n++] = x[r * C + cx + e];
  return n;
}

__kernel __attribute__((reqd_work_group_size(WX, ROWS, 1)))
void transpose(__global const float* x, __global float* y, const int R, const int C) {
  const int tx = get_local_id(0);
  const int ty = get_local_id(1);
  const int c0 = get_group_id(0) * TC;  // first column of x in this tile
  const int r0 = get_group_id(1) * TR;  // first row of x in this tile
  const bool inside = r0 + TR <= R && c0 + TC <= C;
  const int cx = c0 + tx * VW;  // the first of this work-item's VW columns of x
  const bool fast = inside && C % VW == 0;

#if LOCAL
  __local float tile[TR][TC + PAD];
  // Load: tile[j][tx * VW + e] = x[r0 + j][cx + e].
  for (int j = ty; j < TR; j += ROWS) {
    float t[VW];
    const int n = ReadRow(x, R, C, r0 + j, cx, fast, t);
    for (int e = 0; e < n; ++e) tile[j][tx * VW + e] = t[e];
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  // Store: row c0 + jj of y, its columns r0 + i .. r0 + i + VW - 1 = rows of x; tile[i + e][jj].
  for (int jj = ty; jj < TC; jj += ROWS) {
    const int yr = c0 + jj;
    for (int i = tx * VW; i < TR; i += TC) {
      float t[VW];
      for (int e = 0; e < VW; ++e) t[e] = tile[i + e][jj];
      if (inside && R % VW == 0) {
        VSTORE(VLOAD(t), y + yr * R + r0 + i);
      } else {
        for (int e = 0; e < VW; ++e) {
          if (yr < C && r0 + i + e < R) y[yr * R + r0 + i + e] = t[e];
        }
      }
    }
  }
#else
  // Straight through: y[cx + e][r] = x[r][cx + e].
  for (int j = ty; j < TR; j += ROWS) {
    float t[VW];
    const int r = r0 + j;
    const int n = ReadRow(x, R, C, r, cx, fast, t);
    for (int e = 0; e < n; ++e) y[(cx + e) * R + r] = t[e];
  }
#endif
}
