// Naive reference for the sum of x[0 .. N-1]: a single block of RBLOCK threads (RBLOCK is a power
// of two, fixed by the problem's defines). Thread i sums x[i], x[i + RBLOCK], ... in double, then
// a tree reduction in shared memory (also double) gives the total. Double accumulation makes the
// reference much more accurate than any f32 candidate.
extern "C" __global__ void reduce_ref(const float* x, float* out, const int N) {
  __shared__ double red[RBLOCK];
  const int tid = threadIdx.x;
  double s = 0.0;
  for (int i = tid; i < N; i += RBLOCK) s += (double)x[i];
  red[tid] = s;
  __syncthreads();
  for (int h = RBLOCK / 2; h > 0; h >>= 1) {
    if (tid < h) red[tid] += red[tid + h];
    __syncthreads();
  }
  if (tid == 0) out[0] = (float)red[0];
}
