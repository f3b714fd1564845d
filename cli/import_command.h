#pragma once

// `kforge import FILE.py`: a PyTorch module in KernelBench's format (class Model(nn.Module),
// get_inputs(), get_init_inputs(), module-level size constants) becomes a problem folder: buffers
// from get_inputs() and the module's state, outputs from one forward, the module as the
// reference, and a tunable seed kernel where the forward is of a family kforge has a template
// for (none where only a model can write the kernel). The file runs in the jailed PyTorch process
// the workers use (kforge-sandbox --python), never in this one.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kforge::cli {

struct ImportArgs {
  std::string file;
  std::string backend = "opencl";   // opencl | cuda
  std::vector<std::string> sets;    // NAME=VALUE: the module's constants
  // Halve the largest constants (not those set) until every tensor holds at most this many
  // elements; 0 = as the file (or --set) says.
  int64_t fit = 0;
  int64_t max_elements = int64_t{1} << 26;  // a larger tensor is refused, naming it
  std::string out_dir;
  bool force = false;               // write into a folder that is not empty
  bool quiet = false;
  double timeout_seconds = 600;
};

struct ImportSummary {
  std::string dir;
  std::string family;  // the seed's template; "" = no seed (a model writes the kernels)
  std::string why;     // why no template fits
  std::string sizes;   // the main size set, "N=1024 K=512"
  bool check_set = false;
};

// Imports; the folder is written and loads (LoadProblem). InvalidArgument for the file's own
// errors (it does not import, forward raises, a tensor is too large: the message says which).
[[nodiscard]] absl::StatusOr<ImportSummary> ImportModule(const ImportArgs& args);

// Whether `path` names a module file to import rather than a problem folder.
bool IsModuleFile(const std::string& path);

int RunImport(const ImportArgs& args);

}  // namespace kforge::cli
