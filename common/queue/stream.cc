#include "common/queue/stream.h"

#include "common/dtype.h"

namespace kforge {

std::string StreamFor(const v1::Problem& problem, std::string_view device_class) {
  std::string backend(BackendName(problem.backend()));
  if (problem.backend() == v1::BACKEND_REPLAY) return backend;
  // A PyTorch reference needs a worker with torch: only those read this stream.
  if (problem.reference().has_pytorch()) backend += "+torch";
  if (device_class.empty()) return backend;
  return backend + ":" + std::string(device_class);
}

std::string StreamOf(v1::Backend backend, bool torch, std::string_view device_class) {
  v1::Problem p;
  p.set_backend(backend);
  if (torch) p.mutable_reference()->mutable_pytorch();
  return StreamFor(p, device_class);
}

}  // namespace kforge
