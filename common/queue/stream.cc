#include "common/queue/stream.h"

#include "common/dtype.h"

namespace kforge {

std::string StreamFor(const v1::Problem& problem, std::string_view device_class) {
  std::string backend(BackendName(problem.backend()));
  if (device_class.empty() || problem.backend() == v1::BACKEND_REPLAY) return backend;
  return backend + ":" + std::string(device_class);
}

}  // namespace kforge
