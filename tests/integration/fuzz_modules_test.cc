// Seeded, bounded fuzzing of PyTorch problems through the real `kforge` binary: module files
// imported and then broken, the way a tenant's folder can arrive at a worker that never saw the
// import. The imported problem's module (model.py) is mutated (lines deleted, duplicated or cut;
// a forward that raises, returns the wrong thing, hangs, allocates without bound, exits, kills
// its parent, writes to the frames' descriptors, reads stdin, forks, opens sockets, writes
// outside its folder; invalid UTF-8) and so is its `reference:` block (unknown names, host
// paths, a missing file). `kforge validate` runs on every case and `kforge eval` on a bounded
// subset: each ends with exit 0, 1 or 2 within its limit, never by a signal, bad input (exit 2)
// names the file, and nothing the module tried to write outside the jail exists afterwards.
//
// Every case is made from a fixed seed: a failure prints the case and its mutations; rerun one
// with KFORGE_FUZZ_CASE=N.

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/integration/torch_available.h"
#include "tests/testutil/subprocess.h"
#include "tests/testutil/temp_dir.h"

namespace kforge {
namespace {

namespace fs = std::filesystem;
using ::kforge::testing::BinaryDir;
using ::kforge::testing::Outcome;
using ::kforge::testing::RunWithLimit;
using ::kforge::testing::TempDir;
using Rng = std::mt19937_64;

constexpr uint64_t kSeed = 20261203;
constexpr int kCases = 24;
// `kforge eval` runs that reach the module (a Python process each: seconds).
constexpr int kMaxEvals = 10;
constexpr double kValidateLimitSeconds = 30;
// The sandbox watchdog is 5 s (--timeout): a hanging module costs at most that per stage.
constexpr double kEvalLimitSeconds = 90;

std::string Kforge() { return BinaryDir() + "/cli/kforge"; }

size_t Pick(Rng& rng, size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); }

// The modules the cases start from: an elementwise chain, a module with parameters, a reduction.
struct Base {
  const char* name;
  const char* source;
};
const Base kBases[] = {
    {"softsign",
     "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def __init__(self):\n"
     "        super().__init__()\n\n    def forward(self, x):\n        return x / (1 + torch.abs(x))\n\n"
     "batch_size = 8\ndim = 128\n\ndef get_inputs():\n    return [torch.rand(batch_size, dim)]\n\n"
     "def get_init_inputs():\n    return []\n"},
    {"linear",
     "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def __init__(self, i, o):\n"
     "        super().__init__()\n        self.fc = nn.Linear(i, o)\n\n    def forward(self, x):\n"
     "        return self.fc(x)\n\nbatch = 8\nin_features = 32\nout_features = 16\n\n"
     "def get_inputs():\n    return [torch.randn(batch, in_features)]\n\n"
     "def get_init_inputs():\n    return [in_features, out_features]\n"},
    {"rowsum",
     "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def __init__(self):\n"
     "        super().__init__()\n\n    def forward(self, x):\n        return torch.sum(x, dim=1)\n\n"
     "rows = 16\ncols = 64\n\ndef get_inputs():\n    return [torch.randn(rows, cols)]\n\n"
     "def get_init_inputs():\n    return []\n"},
};

struct Folder {
  std::string yaml;
  std::string model;
  std::string marker;  // a path a hostile module tried to create; must not exist afterwards
};

using Mutation = std::function<std::string(Folder&, Rng&)>;

// Replaces the body of forward() (everything after its `def` line up to the next blank line).
bool ReplaceForward(std::string& src, const std::string& body) {
  const size_t def = src.find("def forward(");
  if (def == std::string::npos) return false;
  const size_t start = src.find('\n', def) + 1;
  const size_t end = src.find("\n\n", start);
  src.replace(start, (end == std::string::npos ? src.size() : end) - start, body);
  return true;
}

std::vector<Mutation> ModelMutations() {
  std::vector<Mutation> m;
  m.push_back([](Folder& f, Rng& rng) {
    std::vector<std::string> lines = absl::StrSplit(f.model, '\n');
    const size_t i = Pick(rng, lines.size());
    const std::string gone = lines[i];
    lines.erase(lines.begin() + static_cast<long>(i));
    f.model = absl::StrJoin(lines, "\n");
    return absl::StrCat("model.py: delete line ", i + 1, " (", gone, ")");
  });
  m.push_back([](Folder& f, Rng& rng) {
    std::vector<std::string> lines = absl::StrSplit(f.model, '\n');
    const size_t i = Pick(rng, lines.size());
    lines.insert(lines.begin() + static_cast<long>(i), lines[i]);
    f.model = absl::StrJoin(lines, "\n");
    return absl::StrCat("model.py: duplicate line ", i + 1);
  });
  m.push_back([](Folder& f, Rng& rng) {
    const size_t at = Pick(rng, f.model.size());
    f.model.resize(at);
    return absl::StrCat("model.py: cut at byte ", at);
  });
  m.push_back([](Folder& f, Rng&) {
    f.model.insert(f.model.size() / 2, "\xff\xfe\xc3(");
    return std::string("model.py: invalid UTF-8 in the middle");
  });
  // forward() bodies: wrong answers, errors, and attacks on the process that runs it.
  m.push_back([](Folder& f, Rng& rng) {
    const std::string bodies[] = {
        "        raise RuntimeError('kaboom')",
        "        return 42",
        "        return 'not a tensor'",
        "        return None",
        "        return [torch.zeros(1)] * 3",
        "        return torch.zeros(1)",
        "        return torch.full((3, 3), float('nan'))",
        "        return torch.empty(1 << 20, 1 << 20)",
        "        return x.double()",
        "        return x.t()",
        "        while True:\n            pass",
        "        import time\n        time.sleep(3600)",
        "        import sys\n        sys.exit(3)",
        "        import os\n        os._exit(0)",
        "        import os, signal\n        os.kill(os.getppid(), signal.SIGKILL)\n        return x",
        "        import os\n        os.write(1, b'\\xff' * 4096)\n        return x",
        "        import os\n        os.write(3, b'\\x00\\x00\\x00\\x10garbage') ; os.write(4, b'x' * 64)\n        return x",
        "        import sys\n        sys.stdin.read()\n        return x",
        "        import os\n        os.fork()\n        return x",
        "        import socket\n        socket.create_connection(('127.0.0.1', 22), timeout=1)\n        return x",
        "        open('/etc/shadow').read()\n        return x",
        "        x = bytearray(1 << 40)\n        return x",
    };
    const std::string body = bodies[Pick(rng, std::size(bodies))];
    if (!ReplaceForward(f.model, body)) return std::string("no forward");
    return absl::StrCat("model.py: forward := ", body.substr(8));
  });
  m.push_back([](Folder& f, Rng&) {
    // Written where the module's folder is not: the jail allows no writes outside it.
    f.marker = absl::StrCat(fs::temp_directory_path().string(), "/kforge-fuzz-escaped-", getpid());
    const std::string body = "        open('" + f.marker + "', 'w').write('x')\n        return x";
    if (!ReplaceForward(f.model, body)) return std::string("no forward");
    return absl::StrCat("model.py: forward writes ", f.marker);
  });
  m.push_back([](Folder& f, Rng& rng) {
    const std::string tops[] = {"while True:\n    pass\n", "import os\nos.system('true')\n",
                                "raise SystemExit(0)\n", "import ctypes\nctypes.string_at(0)\n",
                                "import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))\n"};
    const std::string top = tops[Pick(rng, std::size(tops))];
    f.model = top + f.model;
    return absl::StrCat("model.py: at import: ", top);
  });
  return m;
}

// The reference block of problem.yaml.
std::vector<Mutation> YamlMutations() {
  std::vector<Mutation> m;
  m.push_back([](Folder& f, Rng& rng) {
    const std::string files[] = {"/etc/passwd", "../../../../etc/passwd", "missing.py", "\"\"", ".",
                                 "problem.yaml", "\"model\\0.py\""};
    const std::string v = files[Pick(rng, std::size(files))];
    const size_t at = f.yaml.find("pytorch: model.py");
    if (at == std::string::npos) return std::string("no pytorch:");
    f.yaml.replace(at, std::string("pytorch: model.py").size(), "pytorch: " + v);
    return absl::StrCat("reference.pytorch := ", v);
  });
  m.push_back([](Folder& f, Rng& rng) {
    const std::string lists[] = {"inputs: []", "inputs: [nope]", "outputs: []", "outputs: [x]",
                                 "outputs: [out, out]", "constants: [no_such_size]", "inputs: {a: 1}"};
    const std::string v = lists[Pick(rng, std::size(lists))];
    const std::string key = v.substr(0, v.find(':') + 1);
    const size_t ref = f.yaml.find("reference:");
    const size_t at = f.yaml.find("  " + key, ref);
    if (ref == std::string::npos || at == std::string::npos) return absl::StrCat("no ", key);
    const size_t eol = f.yaml.find('\n', at);
    f.yaml.replace(at, eol - at, "  " + v);
    return absl::StrCat("reference.", v);
  });
  m.push_back([](Folder& f, Rng&) {
    const size_t at = f.yaml.find("fill: module");
    if (at == std::string::npos) {
      const size_t in = f.yaml.find("role: in");
      if (in == std::string::npos) return std::string("no input");
      f.yaml.insert(in + std::string("role: in").size(), ", fill: module");
      return std::string("an input filled from the module's state");
    }
    f.yaml.replace(at, std::string("fill: module").size(), "fill: \"uniform(0, 1)\"");
    return std::string("a parameter filled at random");
  });
  return m;
}

std::string Judge(const Outcome& o, const std::string& cmd) {
  if (std::string bad = testing::JudgeKforgeExit(o, cmd); !bad.empty()) return bad;
  if (o.exit_code == 2 && o.err.find("problem.yaml") == std::string::npos &&
      o.err.find("model.py") == std::string::npos && o.err.find("/etc/passwd") == std::string::npos &&
      o.err.find("missing.py") == std::string::npos) {
    return absl::StrCat(cmd, " refused the folder without naming the file: ", o.Describe());
  }
  return "";
}

TEST(FuzzModulesTest, BrokenAndHostileImportedProblems) {
  if (const std::string why = TorchMissing(); !why.empty()) GTEST_SKIP() << "no PyTorch here: " << why;
  TempDir tmp;
  // Import each base once; the cases copy the folders.
  std::vector<std::string> imported;
  for (const Base& b : kBases) {
    const std::string file = tmp.Write(absl::StrCat(b.name, ".py"), b.source);
    const std::string out = tmp.path() + "/base-" + b.name;
    const Outcome o = RunWithLimit({Kforge(), "import", file, "--out", out, "--timeout", "30"}, 120);
    ASSERT_TRUE(o.exited && o.exit_code == 0) << b.name << ": " << o.Describe();
    imported.push_back(out);
  }
  const auto model_mutations = ModelMutations();
  const auto yaml_mutations = YamlMutations();
  const char* only_env = std::getenv("KFORGE_FUZZ_CASE");
  const int only = only_env != nullptr && *only_env ? std::atoi(only_env) : -1;
  int evals = 0, refused = 0;
  for (int c = 0; c < kCases; ++c) {
    if (only >= 0 && c != only) continue;
    Rng rng(kSeed + static_cast<uint64_t>(c));
    const size_t base = Pick(rng, imported.size());
    const std::string rel = absl::StrCat("case", c);
    tmp.CopyTree(imported[base], rel);
    const std::string dir = tmp.path() + "/" + rel;
    Folder f{tmp.Read(rel + "/problem.yaml"), tmp.Read(rel + "/model.py"), ""};
    std::vector<std::string> applied;
    const size_t count = 1 + Pick(rng, 2);
    for (size_t k = 0; k < count; ++k) {
      applied.push_back(Pick(rng, 4) == 0 ? yaml_mutations[Pick(rng, yaml_mutations.size())](f, rng)
                                          : model_mutations[Pick(rng, model_mutations.size())](f, rng));
    }
    tmp.Write(rel + "/problem.yaml", f.yaml);
    tmp.Write(rel + "/model.py", f.model);
    const std::string context = absl::StrCat("case ", c, " (KFORGE_FUZZ_CASE=", c, ") from ", kBases[base].name,
                                             "\n  mutations:\n    ", absl::StrJoin(applied, "\n    "),
                                             "\n  folder: ", dir);
    const Outcome v = RunWithLimit({Kforge(), "validate", dir}, kValidateLimitSeconds);
    std::string bad = Judge(v, "kforge validate");
    EXPECT_EQ(bad, "") << context;
    if (!bad.empty()) continue;
    if (v.exit_code != 0) {
      ++refused;
      continue;
    }
    if (evals >= kMaxEvals) continue;
    ++evals;
    const Outcome e = RunWithLimit({Kforge(), "eval", dir, "--timeout", "5"}, kEvalLimitSeconds);
    bad = Judge(e, "kforge eval");
    EXPECT_EQ(bad, "") << context;
    if (!f.marker.empty()) {
      EXPECT_FALSE(fs::exists(f.marker)) << "the module wrote outside its jail: " << context;
      std::error_code ec;
      fs::remove(f.marker, ec);
    }
  }
  std::cerr << "fuzz: " << kCases << " module cases; " << refused << " refused by validate, " << evals
            << " evaluated\n";
}

}  // namespace
}  // namespace kforge
