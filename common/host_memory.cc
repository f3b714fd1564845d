#include "common/host_memory.h"

#include <malloc.h>

namespace kforge {

bool KeepLargeAllocationsInHeap() {
  // A fixed threshold also switches off glibc's dynamic one, which tops out at 32 MB. Some glibc
  // versions cap the threshold itself; then serve large blocks from the heap by allowing no mmap
  // at all (malloc still falls back to mmap when the heap cannot grow). The trim threshold goes
  // last: set alone it would freeze the mmap threshold at its 128 KiB default.
  if (mallopt(M_MMAP_THRESHOLD, 1 << 30) != 1 && mallopt(M_MMAP_MAX, 0) != 1) return false;
  return mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
}

}  // namespace kforge
