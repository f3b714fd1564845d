// Naive reference for the sum of x[0 .. N-1]: a single work-group of RWG work-items (RWG is a
// power of two, fixed by the problem's defines). Work-item i sums x[i], x[i + RWG], ... in
// double, then a tree reduction in local memory (also double) gives the total. Double
// accumulation makes the reference much more accurate than any f32 candidate.
#pragma OPENCL EXTENSION cl_khr_fp64 : enable

__kernel __attribute__((reqd_work_group_size(RWG, 1, 1)))
void reduce_ref(__global const float* x, __global float* out, const int N) {
  const int lid = get_local_id(0);
  __local double red[RWG];
  double s = 0.0;
  for (int i = lid; i < N; i += RWG) s += (double)x[i];
  red[lid] = s;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int h = RWG / 2; h > 0; h >>= 1) {
    if (lid < h) red[lid] += red[lid + h];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (lid == 0) out[0] = (float)red[0];
}
