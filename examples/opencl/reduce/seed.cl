// Two-pass sum of x[0 .. N-1] into out[0]; deterministic (no atomics).
//
// Pass 1, reduce_partial: work-group g sums the WG * ITEMS * VW consecutive elements starting at
//   g * WG * ITEMS * VW into partial[g] (G = ceil_div(N, WG * ITEMS * VW) work-groups). A
//   work-item adds ITEMS vectors of VW elements, the vectors WG apart (so a work-group reads
//   contiguous memory), into ACC independent accumulators (more additions in flight), then a
//   tree reduction in local memory combines the work-group.
// Pass 2, reduce_final: one work-group of WG work-items sums the G partials the same way.
// `partial` is a scratch buffer of G floats declared in the launch plan.
//
// Knobs (-D):
//   WG     work-group size of both passes; a power of two
//   ITEMS  vectors summed per work-item in pass 1 (more work per item, fewer partials)
//   VW     elements per vector load (1, 2, 4, 8, 16)
//   ACC    independent accumulators per work-item (1, 2, 4)

// Tree reduction of red[0 .. WG-1]; the result is in red[0] for every work-item.
inline float group_sum(__local float* red, const int lid, const float v) {
  red[lid] = v;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int h = WG / 2; h > 0; h >>= 1) {
    if (lid < h) red[lid] += red[lid + h];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  return red[0];
}

#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#if VW == 1
typedef float floatv;
#define VLOAD(p) (*(p))
#define HSUM(v) (v)
#else
typedef CAT(float, VW) floatv;
#define VLOAD(p) CAT(vload, VW)(0, (p))
inline float HSUM(floatv v) {
  float t[VW];
  CAT(vstore, VW)(v, 0, t);
  float s = 0.0f;
  for (int e = 0; e < VW; ++e) s += t[e];
  return s;
}
#endif

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void reduce_partial(__global const float* x, __global float* partial, const int N) {
  const int lid = get_local_id(0);
  const int base = get_group_id(0) * (WG * ITEMS * VW);
  __local float red[WG];
  floatv acc[ACC];
  for (int a = 0; a < ACC; ++a) acc[a] = (floatv)(0.0f);
  float tail = 0.0f;
  for (int i = 0; i < ITEMS; ++i) {
    const int idx = base + (i * WG + lid) * VW;
    if (idx + VW <= N) {
      acc[i % ACC] += VLOAD(x + idx);
    } else {
      for (int e = 0; e < VW && idx + e < N; ++e) tail += x[idx + e];  // the last, partial vector
    }
  }
  float s = tail;
  for (int a = 0; a < ACC; ++a) s += HSUM(acc[a]);
  const float total = group_sum(red, lid, s);
  if (lid == 0) partial[get_group_id(0)] = total;
}

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void reduce_final(__global const float* partial, __global float* out, const int G) {
  const int lid = get_local_id(0);
  __local float red[WG];
  float s = 0.0f;
  for (int i = lid; i < G; i += WG) s += partial[i];
  const float total = group_sum(red, lid, s);
  if (lid == 0) out[0] = total;
}
