#include "common/host_memory.h"

#include <malloc.h>

namespace kforge {

void KeepLargeAllocationsInHeap() {
  // Fixed thresholds also switch off glibc's dynamic threshold, which tops out at 32 MB.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

}  // namespace kforge
