#include "services/llm-proxy/prompt_builder.h"

#include <algorithm>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/dtype.h"
#include "common/launch.h"
#include "google/protobuf/util/json_util.h"

namespace kforge::llm {

int64_t EstimateTokens(const std::string& text) { return static_cast<int64_t>(text.size() + 3) / 4; }

namespace {

std::string Plan(const v1::Candidate& c, const v1::Problem& p) {
  v1::LaunchPlan plan = c.plan();
  if (plan.launches().empty()) {
    *plan.mutable_launches() = p.seed().launches();
    *plan.mutable_scratch() = p.seed().scratch();
  }
  std::string out = "launches:\n";
  for (const auto& l : plan.launches()) {
    absl::StrAppend(&out, "  - {kernel: ", l.kernel());
    if (p.backend() == v1::BACKEND_CUDA) {
      absl::StrAppend(&out, ", grid: [\"", absl::StrJoin(l.grid(), "\", \""), "\"], block: [\"",
                      absl::StrJoin(l.block(), "\", \""), "\"]");
      if (!l.shared_bytes().empty()) absl::StrAppend(&out, ", shared_bytes: \"", l.shared_bytes(), "\"");
    } else {
      absl::StrAppend(&out, ", global: [\"", absl::StrJoin(l.global(), "\", \""), "\"]");
      if (!l.local().empty()) absl::StrAppend(&out, ", local: [\"", absl::StrJoin(l.local(), "\", \""), "\"]");
    }
    absl::StrAppend(&out, ", args: [", absl::StrJoin(l.args(), ", "), "]}\n");
  }
  if (!plan.scratch().empty()) {
    absl::StrAppend(&out, "scratch:\n");
    for (const auto& s : plan.scratch()) {
      absl::StrAppend(&out, "  ", s.name(), ": {dtype: ", DTypeName(s.dtype()), ", shape: [\"",
                      absl::StrJoin(s.shape(), "\", \""), "\"]}\n");
    }
  }
  return out;
}

std::string Params(const v1::Candidate& c) {
  const ParamAssignment a(c.params().begin(), c.params().end());
  return a.empty() ? "(none)" : FormatParams(a);
}

std::string Metrics(const v1::EvaluationResult& r) {
  if (r.outcome() == v1::OUTCOME_UNSPECIFIED) return "not evaluated";
  std::string out = absl::StrCat("outcome ", OutcomeName(r.outcome()));
  if (r.outcome() == v1::OUTCOME_OK) absl::StrAppend(&out, absl::StrFormat(", speedup %.3fx over the reference", r.speedup()));
  for (const auto& t : r.timings()) {
    absl::StrAppend(&out, absl::StrFormat("; %s: %.4g ms (reference %.4g ms)", t.size_set(),
                                          t.candidate().median_seconds() * 1e3, t.reference().median_seconds() * 1e3));
  }
  const auto& res = r.resources();
  if (res.registers_per_thread() > 0) absl::StrAppend(&out, "; registers ", res.registers_per_thread());
  if (res.shared_bytes() > 0) absl::StrAppend(&out, "; shared ", res.shared_bytes(), " B");
  if (res.spill_bytes() > 0) absl::StrAppend(&out, "; spills ", res.spill_bytes(), " B");
  if (r.outcome() != v1::OUTCOME_OK && !r.message().empty()) absl::StrAppend(&out, "\nfeedback: ", r.message());
  return out;
}

std::string Fence(const v1::Problem& p) { return p.backend() == v1::BACKEND_CUDA ? "cuda" : "c"; }

std::string Device(const v1::DeviceInfo& d) {
  std::string out = absl::StrCat(d.name(), " (", BackendName(d.backend()));
  if (!d.vendor().empty()) absl::StrAppend(&out, ", ", d.vendor());
  if (!d.arch().empty()) absl::StrAppend(&out, ", ", d.backend() == v1::BACKEND_CUDA ? "compute capability " : "", d.arch());
  if (d.compute_units() > 0) absl::StrAppend(&out, ", ", d.compute_units(), " compute units");
  if (d.clock_mhz() > 0) absl::StrAppend(&out, ", ", d.clock_mhz(), " MHz");
  if (d.global_memory_bytes() > 0) absl::StrAppend(&out, ", ", d.global_memory_bytes() >> 20, " MiB global memory");
  return out + ")";
}

// The lines of `after` that differ from `before`, as a short unified-style diff: a common prefix
// and suffix are cut, and at most `max_lines` lines of each side are kept.
std::string Diff(const std::string& before, const std::string& after, size_t max_lines = 24) {
  const std::vector<std::string> a = absl::StrSplit(before, '\n');
  const std::vector<std::string> b = absl::StrSplit(after, '\n');
  size_t head = 0;
  while (head < a.size() && head < b.size() && a[head] == b[head]) ++head;
  size_t tail = 0;
  while (tail < a.size() - head && tail < b.size() - head && a[a.size() - 1 - tail] == b[b.size() - 1 - tail]) ++tail;
  if (head == a.size() && head == b.size()) return "";
  std::string out = absl::StrCat("@@ line ", head + 1, " @@\n");
  auto side = [&](const std::vector<std::string>& lines, char mark) {
    const size_t n = lines.size() - head - tail;
    for (size_t i = 0; i < std::min(n, max_lines); ++i) absl::StrAppend(&out, std::string(1, mark), lines[head + i], "\n");
    if (n > max_lines) absl::StrAppend(&out, std::string(1, mark), " ... (", n - max_lines, " more lines)\n");
  };
  side(a, '-');
  side(b, '+');
  return out;
}

}  // namespace

absl::StatusOr<Prompt> BuildPrompt(const v1::MutateRequest& req, int64_t budget, bool whole_file,
                                   const std::string& edit_failure) {
  const v1::Problem& p = req.problem();
  const bool from_scratch = req.parents().empty();
  if (from_scratch && !p.reference().has_pytorch()) return absl::InvalidArgumentError("mutate needs a parent");
  Prompt out;
  const bool cuda = p.backend() == v1::BACKEND_CUDA;
  out.system = absl::StrCat(
      "You optimise ", cuda ? "CUDA" : "OpenCL C", " kernels for speed without changing what they compute.\n",
      "Rules:\n- Write device code only: kernels and device functions. No host code runs.\n",
      cuda ? "- Kernels are declared extern \"C\" __global__. Allowed includes: cuda_fp16.h, cuda_bf16.h, "
             "cooperative_groups.h, mma.h, cuda_pipeline.h; nothing else.\n"
           : "- No #include at all.\n",
      "- Knobs arrive as -D NAME=value macros; keep using them or replace them with constants.\n",
      "- Results must match the reference within the tolerance on every size set; outputs are checked ",
      "element by element, inputs must not be written, and repeated runs must agree.\n",
      whole_file ? "Reply with the complete new source in one ```" + Fence(p) + " block.\n"
                 : "Reply with edits to the parent as blocks of\n<<<<<<< SEARCH\n(exact lines of the parent)\n"
                   "=======\n(new lines)\n>>>>>>> REPLACE\nor with the complete new source in one ```" +
                       Fence(p) + " block.\n",
      "If the launch configuration must change, add a ```yaml block with the new launch plan (same format as "
      "the parent's: launches, optional scratch); dimensions are integer expressions over sizes and knobs.\n");

  std::string problem = absl::StrCat("# Problem: ", p.name(), "\n", p.description(), "\n\nBuffers:\n");
  for (const auto& b : p.buffers()) {
    absl::StrAppend(&problem, "- ", b.name(), ": ", DTypeName(b.dtype()), " [", absl::StrJoin(b.shape(), ", "), "], ",
                    RoleName(b.role()), "\n");
  }
  for (const auto& s : p.scalars()) absl::StrAppend(&problem, "- scalar ", s.name(), ": ", DTypeName(s.dtype()), "\n");
  absl::StrAppend(&problem, "Size sets:");
  for (const auto& set : p.size_sets()) {
    std::map<std::string, int64_t> sorted(set.sizes().begin(), set.sizes().end());
    absl::StrAppend(&problem, " ", set.name(), " {", absl::StrJoin(sorted, ", ", absl::PairFormatter("=")), "}");
  }
  absl::StrAppend(&problem, absl::StrFormat("\nTolerance: atol %g, rtol %g\n", p.check().atol(), p.check().rtol()));
  if (!p.seed().params().empty()) {
    absl::StrAppend(&problem, "Knobs (the allowed values):");
    for (const auto& k : p.seed().params()) absl::StrAppend(&problem, " ", k.name(), " in {", absl::StrJoin(k.values(), ", "), "};");
    absl::StrAppend(&problem, "\n");
    if (!p.seed().constraints().empty()) {
      absl::StrAppend(&problem, "Constraints on the knobs: ", absl::StrJoin(p.seed().constraints(), "; "), "\n");
    }
  }
  if (req.has_target_device() && !req.target_device().name().empty()) {
    absl::StrAppend(&problem, "Target device: ", Device(req.target_device()), "\n");
  }
  if (p.reference().has_pytorch()) {
    const auto& t = p.reference().pytorch();
    absl::StrAppend(&problem, "\nThe reference is this PyTorch module (", t.source_file(),
                    "); a kernel must compute its forward() outputs [", absl::StrJoin(t.outputs(), ", "),
                    "] from its inputs [", absl::StrJoin(t.inputs(), ", "), "]",
                    t.state().empty() ? "" : " and its parameters (read-only buffers named after its state_dict)",
                    ". Its module-level constants take each size set's sizes of the same name.\n```python\n",
                    t.source(), "\n```\n");
  }
  if (from_scratch) {
    const std::string task = absl::StrCat(
        "\n# Task\nNo kernel exists yet. Write one that computes the reference's outputs into the out buffers, ",
        "as fast as you can, for every size set. Reply with the complete source in one ```", Fence(p),
        " block and its launch plan in one ```yaml block:\n```yaml\nlaunches:\n  - {kernel: NAME, ",
        p.backend() == v1::BACKEND_CUDA ? "grid: [\"EXPR\"], block: [\"EXPR\"]" : "global: [\"EXPR\"], local: [\"EXPR\"]",
        ", args: [BUFFER_OR_SIZE_OR_EXPR, ...]}\n```\nArguments are passed in order: a buffer name passes the buffer, a size "
        "or integer expression passes an int.\n");
    const int64_t essential = EstimateTokens(out.system + problem + task);
    if (essential > budget) {
      return absl::ResourceExhaustedError(absl::StrCat("the prompt needs about ", essential,
                                                       " tokens but the model's budget is ", budget));
    }
    out.user = problem + task;
    out.estimated_tokens = essential;
    return out;
  }

  const v1::ParentContext& parent = req.parents(0);
  std::string par = absl::StrCat("\n# Parent (", Params(parent.candidate()), ")\n", Metrics(parent.result()),
                                 "\n```", Fence(p), "\n", parent.candidate().source(), "\n```\nLaunch plan:\n```yaml\n",
                                 Plan(parent.candidate(), p), "```\n");
  if (req.parents_size() > 1) {
    const v1::ParentContext& other = req.parents(1);
    absl::StrAppend(&par, "\n# Second parent, combine its ideas (", Params(other.candidate()), ")\n",
                    Metrics(other.result()), "\n```", Fence(p), "\n", other.candidate().source(), "\n```\n");
  }
  std::string task = whole_file ? absl::StrCat("\nYour edits did not apply (", edit_failure,
                                               "). Reply with the complete new source instead.\n")
                                : "\nPropose one faster version of the parent.\n";
  const int64_t essential = EstimateTokens(out.system + problem + par + task);
  if (essential > budget) {
    return absl::ResourceExhaustedError(absl::StrCat("the prompt needs about ", essential,
                                                     " tokens but the model's budget is ", budget));
  }
  // Optional context, most useful first; each is added only while it fits.
  std::vector<std::pair<std::string, std::string>> extras;
  for (const auto& ins : req.inspirations()) {
    extras.emplace_back(absl::StrCat("inspiration source ", ins.candidate().id()),
                        absl::StrCat("\n# Inspiration (", Params(ins.candidate()), "): ", Metrics(ins.result()),
                                     "\n```", Fence(p), "\n", ins.candidate().source(), "\n```\n"));
  }
  for (const auto& f : req.recent_failures()) {
    std::string text = absl::StrCat("\n# A recent attempt that failed (", Params(f.candidate()), "): ",
                                    Metrics(f.result()), "\n");
    const std::string diff = f.parent_source().empty() ? "" : Diff(f.parent_source(), f.candidate().source());
    if (!diff.empty()) {
      absl::StrAppend(&text, "Its change to its parent:\n```diff\n", diff, "```\n");
    } else if (f.parent_source().empty()) {
      absl::StrAppend(&text, "```", Fence(p), "\n", f.candidate().source(), "\n```\n");
    }
    extras.emplace_back(absl::StrCat("failure ", f.candidate().id()), std::move(text));
  }
  int64_t used = essential;
  std::string context;
  for (const auto& [name, text] : extras) {
    const int64_t t = EstimateTokens(text);
    if (used + t > budget) {
      out.dropped.push_back(name);
      continue;
    }
    used += t;
    context += text;
  }
  out.user = problem + par + context + task;
  out.estimated_tokens = used;
  return out;
}

}  // namespace kforge::llm
