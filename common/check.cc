#include <cstdio>
#include <cstdlib>

#include "common/status_macros.h"

namespace kforge::internal {

void CheckFailed(const char* file, int line, const char* cond) {
  std::fprintf(stderr, "kforge: invariant broken at %s:%d: %s\n", file, line, cond);
  std::abort();
}

}  // namespace kforge::internal
