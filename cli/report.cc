#include "cli/report.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/dtype.h"
#include "common/launch.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"

namespace kforge::cli {

namespace fs = std::filesystem;

namespace {

absl::Status WriteFile(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path.string()));
  return absl::OkStatus();
}

nlohmann::json ToJson(const google::protobuf::Message& m) {
  std::string s;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &s, o);
  return nlohmann::json::parse(s, nullptr, false);
}

}  // namespace

std::string ProgressSvg(const std::vector<double>& best, const std::string& title) {
  const double w = 640, h = 360, l = 60, r = 20, t = 40, b = 50;
  const double max_y = std::max(1.0, best.empty() ? 1.0 : *std::max_element(best.begin(), best.end())) * 1.1;
  const double n = std::max<double>(1, static_cast<double>(best.size()));
  auto x = [&](double i) { return l + (w - l - r) * (i / n); };
  auto y = [&](double v) { return h - b - (h - t - b) * (v / max_y); };
  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
      "<text x=\"%.0f\" y=\"24\" font-size=\"15\">%s</text>\n",
      w, h, l, title);
  // Axes, ticks and the 1x line (the reference).
  absl::StrAppendFormat(&svg, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n", l, h - b,
                        w - r, h - b);
  absl::StrAppendFormat(&svg, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n", l, t, l,
                        h - b);
  for (int i = 0; i <= 4; ++i) {
    const double v = max_y * i / 4;
    absl::StrAppendFormat(&svg, "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%.2fx</text>\n", l - 6, y(v) + 4, v);
    const double e = n * i / 4;
    absl::StrAppendFormat(&svg, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%.0f</text>\n", x(e), h - b + 18, e);
  }
  absl::StrAppendFormat(&svg,
                        "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#999\" stroke-dasharray=\"4 4\"/>\n",
                        l, y(1), w - r, y(1));
  absl::StrAppendFormat(&svg, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">evaluations</text>\n", (l + w - r) / 2,
                        h - 12);
  absl::StrAppendFormat(&svg,
                        "<text x=\"14\" y=\"%.0f\" transform=\"rotate(-90 14 %.0f)\" text-anchor=\"middle\">best "
                        "speedup over reference</text>\n",
                        (t + h - b) / 2, (t + h - b) / 2);
  std::string pts;
  for (size_t i = 0; i < best.size(); ++i) {
    absl::StrAppendFormat(&pts, "%.1f,%.1f %.1f,%.1f ", x(static_cast<double>(i)), y(best[i]),
                          x(static_cast<double>(i + 1)), y(best[i]));
  }
  absl::StrAppend(&svg, "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\" points=\"", pts, "\"/>\n</svg>\n");
  return svg;
}

ReportedSpeedup ReportedSpeedupOf(const v1::Job& job, const v1::Candidate& best,
                                  const v1::EvaluationResult& result) {
  ReportedSpeedup r;
  r.speedup = result.speedup();
  r.note = job.confirmation().note();
  for (const auto& f : job.confirmation().finalists()) {
    if (f.candidate_id() != best.id() || f.outcome() != v1::OUTCOME_OK) continue;
    r.speedup = f.speedup();
    r.low = f.speedup_low();
    r.high = f.speedup_high();
    r.rounds = f.rounds();
    r.confirmed = true;
    r.separated = job.confirmation().separated();
  }
  return r;
}

ReportedSpeedup JobBestSpeedup(const v1::Job& job) {
  if (job.has_best() && !job.best().id().empty()) return ReportedSpeedupOf(job, job.best(), job.best_result());
  return ReportedSpeedup{.speedup = job.progress().best_speedup()};
}

std::string SpeedupText(const ReportedSpeedup& s) {
  if (!s.confirmed) return absl::StrFormat("%.3fx (unconfirmed: one evaluation's measurement)", s.speedup);
  if (s.rounds == 0) {
    return absl::StrFormat("%.3fx (95%% interval %.3f-%.3fx from its benchmark, which separates it from the other "
                           "finalists: not re-measured)",
                           s.speedup, s.low, s.high);
  }
  return absl::StrFormat("%.3fx (95%% interval %.3f-%.3fx, %d side-by-side rounds)", s.speedup, s.low, s.high,
                         s.rounds);
}

std::string SpeedupCell(const ReportedSpeedup& s) {
  if (!s.confirmed) return absl::StrFormat("%.3fx unconfirmed", s.speedup);
  return absl::StrFormat("%.3fx (%.3f-%.3f)", s.speedup, s.low, s.high);
}

std::string SourceWithDefines(const v1::Problem& problem, const v1::Candidate& candidate) {
  // As the worker compiles it (Screen), and KFORGE=1, which the CUDA compiles define.
  std::map<std::string, int64_t> defines =
      CompileDefines(problem, ParamAssignment(candidate.params().begin(), candidate.params().end()));
  if (problem.backend() == v1::BACKEND_CUDA) defines.emplace("KFORGE", 1);
  std::string out = absl::StrCat("// kforge: candidate ", candidate.id().empty() ? "?" : candidate.id(),
                                 ", with the values it was compiled and timed with (best.json has them too).\n");
  for (const auto& [k, v] : defines) absl::StrAppend(&out, "#ifndef ", k, "\n#define ", k, " ", v, "\n#endif\n");
  absl::StrAppend(&out, "\n", candidate.source());
  return out;
}

std::string BaselineText(const v1::Problem& p, const v1::EvaluationResult& r) {
  if (!p.reference().has_pytorch()) return "";
  const v1::DeviceInfo& d = r.device();
  std::string out = absl::StrCat(" over PyTorch eager (torch ", d.torch_version().empty() ? "?" : d.torch_version(),
                                 ", ", d.torch_device().empty() ? "?" : d.torch_device(), ")");
  if (r.speedup_compiled() > 0) {
    absl::StrAppend(&out, absl::StrFormat("; over torch.compile %.3fx", r.speedup_compiled()));
  } else {
    absl::StrAppend(&out, d.torch_compile() ? "; torch.compile not measured" : "; torch.compile: not in this torch");
  }
  return out;
}

namespace {

// A PyTorch reference's baselines in best.json and report.json: over eager (the reported speedup)
// and over torch.compile where measured, and how eager was timed.
void AddBaselines(nlohmann::json& j, const v1::Problem& p, const v1::EvaluationResult& r, double speedup) {
  if (!p.reference().has_pytorch()) return;
  j["speedup_over_eager"] = speedup;
  j["speedup_over_compile"] = r.speedup_compiled() > 0 ? nlohmann::json(r.speedup_compiled()) : nlohmann::json();
  j["baseline"] = {{"kind", "pytorch"},
                   {"torch", r.device().torch_version()},
                   {"device", r.device().torch_device()},
                   {"compile_available", r.device().torch_compile()},
                   {"timed", absl::StartsWith(r.device().torch_device(), "cuda")
                                 ? "forward() under torch.no_grad() in a warmed-up process, CUDA events around each "
                                   "call (its launch included) with the L2 cache flushed before it, as the "
                                   "candidates are timed"
                                 : "forward() under torch.no_grad(), as a warmed-up process runs it: the same "
                                   "inputs, memory reused (jemalloc with its decay off), on the worker's device"}};
  if (r.device().torch_device() == "cpu") {
    j["baseline"]["note"] = "CPU figures at scaled sizes: not comparable with published GPU numbers";
  }
}

// The best's id and reported speedup, as best.json and report.json's "best" give them.
nlohmann::json SpeedupJson(const std::string& candidate_id, const ReportedSpeedup& s) {
  nlohmann::json j = {{"candidate_id", candidate_id}, {"speedup", s.speedup}, {"confirmed", s.confirmed}};
  if (s.confirmed) {
    j["speedup_interval"] = {s.low, s.high};
    j["confirm_rounds"] = s.rounds;
    j["separated"] = s.separated;
  }
  if (!s.note.empty()) j["note"] = s.note;
  return j;
}

}  // namespace

absl::Status WriteBest(const std::string& out_dir, const v1::Problem& p, const v1::Candidate& b,
                       const v1::EvaluationResult& result, const ReportedSpeedup& speedup) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot create ", out_dir, ": ", ec.message()));
  if (p.backend() != v1::BACKEND_REPLAY) {
    const char* ext = p.backend() == v1::BACKEND_CUDA ? ".cu" : ".cl";
    if (absl::Status st = WriteFile(fs::path(out_dir) / absl::StrCat("best", ext), SourceWithDefines(p, b));
        !st.ok()) {
      return st;
    }
  }
  nlohmann::json bj = SpeedupJson(b.id(), speedup);
  if (speedup.confirmed) bj["first_speedup"] = result.speedup();
  AddBaselines(bj, p, result, speedup.speedup);
  bj["params"] = ToJson(b)["params"];
  v1::LaunchPlan plan = b.plan();
  if (plan.launches().empty()) {
    *plan.mutable_launches() = p.seed().launches();
    *plan.mutable_scratch() = p.seed().scratch();
  }
  bj["launch_plan"] = ToJson(plan);
  bj["timings"] = ToJson(result)["timings"];
  return WriteFile(fs::path(out_dir) / "best.json", bj.dump(2) + "\n");
}

absl::Status WriteReport(const std::string& out_dir, const v1::Job& job, const std::vector<v1::Candidate>& cands,
                         const std::vector<v1::EvaluationResult>& evals) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot create ", out_dir, ": ", ec.message()));
  const v1::Problem& p = job.spec().problem();
  std::map<std::string, const v1::Candidate*> by_id;
  for (const auto& c : cands) by_id[c.id()] = &c;

  // Best-so-far curve in evaluation (sequence) order.
  std::vector<double> curve;
  double best = 0;
  for (const auto& e : evals) {
    if (e.outcome() == v1::OUTCOME_OK) best = std::max(best, e.speedup());
    curve.push_back(best);
  }
  std::vector<const v1::EvaluationResult*> ok;
  for (const auto& e : evals) {
    if (e.outcome() == v1::OUTCOME_OK) ok.push_back(&e);
  }
  std::stable_sort(ok.begin(), ok.end(), [](auto* a, auto* b) { return a->speedup() > b->speedup(); });

  nlohmann::json report;
  report["job"] = ToJson(job);
  report["job"].erase("spec");  // the problem sources are in the problem folder
  report["problem"] = {{"name", p.name()}, {"backend", std::string(BackendName(p.backend()))},
                       {"content_hash", p.content_hash()}};
  std::map<std::string, int64_t> counts;
  for (const auto& e : evals) ++counts[std::string(OutcomeName(e.outcome()))];
  report["outcome_counts"] = counts;
  report["timing"] = {{"elapsed_seconds", job.progress().elapsed_seconds()},
                      {"evaluations", evals.size()},
                      {"evaluations_per_minute",
                       job.progress().elapsed_seconds() > 0 ? 60.0 * evals.size() / job.progress().elapsed_seconds() : 0}};
  // Where the time went: per pipeline stage, over the evaluations that reached it; and the
  // bytes moved to and from the sandbox.
  struct StageTotal {
    int64_t evaluations = 0;
    double seconds = 0;
  };
  std::map<int, StageTotal> stages;  // by v1::Stage, so in pipeline order
  int64_t bytes_sent = 0, bytes_received = 0;
  std::set<std::string> reused_from;  // the earlier jobs whose evaluations this job reused
  int64_t reused = 0;
  for (const auto& e : evals) {
    if (!e.reused_from_job().empty()) {  // measured, and paid for, by another job
      reused_from.insert(e.reused_from_job());
      ++reused;
      continue;
    }
    bytes_sent += e.sandbox_bytes_sent();
    bytes_received += e.sandbox_bytes_received();
    for (const auto& s : e.stages()) {
      StageTotal& t = stages[s.stage()];
      ++t.evaluations;
      t.seconds += s.duration_seconds();
    }
  }
  nlohmann::json stage_json = nlohmann::json::object();
  for (const auto& [stage, t] : stages) {
    stage_json[std::string(StageName(stage))] = {
        {"evaluations", t.evaluations},
        {"total_seconds", t.seconds},
        {"mean_seconds", t.seconds / static_cast<double>(t.evaluations)}};
  }
  report["timing"]["stages"] = stage_json;
  report["timing"]["reused_evaluations"] = reused;
  report["reused_from_jobs"] = reused_from;
  const double n_evals = std::max<double>(1, static_cast<double>(evals.size() - reused));
  report["timing"]["sandbox_bytes_per_evaluation"] = {{"sent", bytes_sent / n_evals},
                                                      {"received", bytes_received / n_evals}};
  nlohmann::json top = nlohmann::json::array();
  for (size_t i = 0; i < ok.size() && i < 10; ++i) {
    const v1::Candidate* c = by_id.count(ok[i]->candidate_id()) ? by_id[ok[i]->candidate_id()] : nullptr;
    nlohmann::json row = {{"candidate_id", ok[i]->candidate_id()}, {"speedup", ok[i]->speedup()}};
    if (c != nullptr) {
      row["params"] = ToJson(*c)["params"];
      row["sequence"] = c->sequence();
      row["mutator"] = v1::MutatorKind_Name(c->mutator());
    }
    top.push_back(row);
  }
  report["top"] = top;
  if (!job.warm_start().empty()) report["warm_start"] = job.warm_start();
  if (job.has_best()) {
    const ReportedSpeedup s = ReportedSpeedupOf(job, job.best(), job.best_result());
    report["best"] = SpeedupJson(job.best().id(), s);
    report["best"]["first_speedup"] = job.best_result().speedup();
    AddBaselines(report["best"], p, job.best_result(), s.speedup);
  }
  report["best_so_far"] = curve;

  std::string md = absl::StrCat("# kforge report: ", p.name(), "\n\n", "- job: `", job.id(), "` (",
                                v1::JobState_Name(job.state()), ": ", job.state_reason(), ")\n",
                                "- backend: ", BackendName(p.backend()), "\n",
                                absl::StrFormat("- evaluations: %d in %.1f s\n", evals.size(), job.progress().elapsed_seconds()));
  if (reused > 0) {
    absl::StrAppend(&md, "  - ", reused, " of them reused from earlier jobs on the same problem and device (",
                    absl::StrJoin(reused_from, ", "), "), not run again; `--fresh` measures every candidate\n");
  }
  if (!job.warm_start().empty()) {
    absl::StrAppend(&md, "- ", job.warm_start(),
                    ": their ranking steered the search, none of their timings counts here; `--cold` starts from "
                    "nothing\n");
  }
  if (job.has_best()) {
    const v1::Candidate& b = job.best();
    const ParamAssignment params(b.params().begin(), b.params().end());
    const ReportedSpeedup s = ReportedSpeedupOf(job, b, job.best_result());
    absl::StrAppend(&md, "- best speedup: **", SpeedupText(s), "**",
                    p.reference().has_pytorch() ? BaselineText(p, job.best_result()) : " over the reference",
                    " (candidate `", b.id(), "`, params ", params.empty() ? "none" : FormatParams(params), ")\n");
    if (s.confirmed) {
      absl::StrAppend(&md, absl::StrFormat("  - its own evaluation had measured %.3fx\n", job.best_result().speedup()));
    }
    if (!s.note.empty()) absl::StrAppend(&md, "  - note: ", s.note, "\n");
    for (const auto& t : job.best_result().timings()) {
      absl::StrAppend(&md, absl::StrFormat("  - size set %s: %.4g ms vs reference %.4g ms\n", t.size_set(),
                                           t.candidate().median_seconds() * 1e3, t.reference().median_seconds() * 1e3));
    }
    if (!job.best_result().device().name().empty()) {
      absl::StrAppend(&md, "- device: ", job.best_result().device().name(), "\n");
    }
  }
  absl::StrAppend(&md, "\n## Outcomes\n\n| outcome | count |\n|---|---|\n");
  for (const auto& [k, v] : counts) absl::StrAppend(&md, "| ", k, " | ", v, " |\n");
  if (!stages.empty()) {
    absl::StrAppend(
        &md,
        "\n## Where the time went\n\nPer evaluation that reached the stage (a sandbox's first "
        "evaluation also measures the reference; reused evaluations are not counted).\n\n| stage | evaluations | mean | total "
        "|\n|---|---|---|---|\n");
    for (const auto& [stage, t] : stages) {
      absl::StrAppend(
          &md, absl::StrFormat("| %s | %d | %.1f ms | %.2f s |\n", StageName(stage), t.evaluations,
                               1e3 * t.seconds / static_cast<double>(t.evaluations), t.seconds));
    }
    if (bytes_sent + bytes_received > 0) {
      absl::StrAppend(
          &md,
          absl::StrFormat("\nMoved to and from the sandbox per evaluation: %.2f MB sent, %.2f MB "
                          "received (mean).\n",
                          bytes_sent / n_evals / 1e6, bytes_received / n_evals / 1e6));
    }
  }
  if (const v1::Confirmation& c = job.confirmation(); c.finalists_size() > 0) {
    // rounds 0: the finalists' own benchmarks separated the first (BenchmarkConfirmation).
    const bool benchmarked = c.finalists(0).outcome() == v1::OUTCOME_OK && c.finalists(0).rounds() == 0;
    absl::StrAppend(&md,
                    benchmarked
                        ? absl::StrFormat("\n## Finalists, as their benchmarks timed them\n\nNot re-measured side by side: "
                                          "each finalist's benchmark (the median of its samples with its ~95%% "
                                          "interval, against the reference timed on the same worker, reference "
                                          "noise %.1f%%) already ranks the first faster than the others beyond "
                                          "their intervals.\n\n",
                                          100 * c.reference_noise())
                        : absl::StrFormat("\n## Finalists, re-measured side by side\n\nEach round timed the reference and "
                                          "every finalist in turn on one worker (reference noise %.1f%%); speedup is the "
                                          "median over rounds with its ~95%% interval.\n\n",
                                          100 * c.reference_noise()),
                    c.reused_from_job().empty()
                        ? ""
                        : absl::StrCat("These are the measurements of job `", c.reused_from_job(),
                                       "`, which re-measured the same finalists (this job reused its evaluations).\n\n"),
                    "| # | candidate | speedup | 95% interval | noise | first measured |\n|---|---|---|---|---|---|\n");
    for (int i = 0; i < c.finalists_size(); ++i) {
      const v1::FinalistTiming& f = c.finalists(i);
      if (f.outcome() != v1::OUTCOME_OK) {
        absl::StrAppend(&md, absl::StrFormat("| %d | `%s` | %s | | | %.3fx |\n", i + 1, f.candidate_id(),
                                             OutcomeName(f.outcome()), f.first_speedup()));
        continue;
      }
      absl::StrAppend(&md, absl::StrFormat("| %d | `%s` | %.3fx | %.3f-%.3fx | %.1f%% | %.3fx |\n", i + 1,
                                           f.candidate_id(), f.speedup(), f.speedup_low(), f.speedup_high(),
                                           100 * f.noise(), f.first_speedup()));
    }
    absl::StrAppend(&md, c.separated() ? "\nThe first finalist is faster than the others beyond the noise.\n"
                                       : "\nThe finalists are not separated: their intervals overlap.\n");
  }
  absl::StrAppend(&md, "\n## Top candidates\n\n| # | candidate | speedup | params |\n|---|---|---|---|\n");
  for (size_t i = 0; i < ok.size() && i < 10; ++i) {
    const v1::Candidate* c = by_id.count(ok[i]->candidate_id()) ? by_id[ok[i]->candidate_id()] : nullptr;
    const ParamAssignment params = c ? ParamAssignment(c->params().begin(), c->params().end()) : ParamAssignment();
    absl::StrAppend(&md, absl::StrFormat("| %d | `%s` | %.3fx | %s |\n", i + 1, ok[i]->candidate_id(), ok[i]->speedup(),
                                         FormatParams(params)));
  }
  absl::StrAppend(&md, "\n![best speedup against evaluations](progress.svg)\n");

  if (absl::Status st = WriteFile(fs::path(out_dir) / "report.json", report.dump(2) + "\n"); !st.ok()) return st;
  if (absl::Status st = WriteFile(fs::path(out_dir) / "report.md", md); !st.ok()) return st;
  if (absl::Status st = WriteFile(fs::path(out_dir) / "progress.svg",
                                  ProgressSvg(curve, absl::StrCat(p.name(), ": best speedup")));
      !st.ok()) {
    return st;
  }
  if (job.has_best()) {
    return WriteBest(out_dir, p, job.best(), job.best_result(), ReportedSpeedupOf(job, job.best(), job.best_result()));
  }
  return absl::OkStatus();
}

}  // namespace kforge::cli
