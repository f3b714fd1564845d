// KeepLargeAllocationsInHeap: after it, a large buffer freed and allocated again reuses its pages
// instead of being mapped (and page-faulted) afresh. ctest runs each test in its own process, so
// the malloc settings do not leak into other tests.

#include "common/host_memory.h"

#include <sys/resource.h>

#include <cstdlib>
#include <cstring>

#include "gtest/gtest.h"

namespace kforge {
namespace {

long MinorFaults() {
  rusage r{};
  getrusage(RUSAGE_SELF, &r);
  return r.ru_minflt;
}

// Page faults taken by `rounds` cycles of allocating, touching and freeing `bytes`.
long FaultsOfCycles(size_t bytes, int rounds) {
  const long before = MinorFaults();
  for (int i = 0; i < rounds; ++i) {
    char* p = static_cast<char*>(std::malloc(bytes));
    if (p == nullptr) {
      ADD_FAILURE() << "malloc(" << bytes << ") failed";
      return 0;
    }
    std::memset(p, i + 1, bytes);
    asm volatile("" : : "r"(p) : "memory");  // keep the writes
    std::free(p);
  }
  return MinorFaults() - before;
}

TEST(HostMemoryTest, LargeBuffersAreReusedRatherThanMappedAfresh) {
  ASSERT_TRUE(KeepLargeAllocationsInHeap());
  constexpr size_t kBytes = size_t{40} << 20;  // above glibc's largest dynamic mmap threshold
  constexpr int kRounds = 8;
  FaultsOfCycles(kBytes, 1);  // the first cycle grows the heap
  const long faults = FaultsOfCycles(kBytes, kRounds);
  const long fresh =
      static_cast<long>(kRounds * kBytes / 4096);  // one fault per page, mapped afresh
  EXPECT_LT(faults, fresh / 4) << "faults " << faults << " for " << kRounds << " cycles of 40 MB";
}

}  // namespace
}  // namespace kforge
