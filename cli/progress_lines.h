#pragma once

// The progress lines `kforge run` prints and `kforge watch` / `submit --watch` print the same way:
// a plain line per improvement, a live status line on a terminal, and a summary at the end.

#include <cstdint>
#include <map>
#include <string>

#include "google/protobuf/timestamp.pb.h"
#include "kforge/v1/candidate.pb.h"
#include "kforge/v1/job.pb.h"

namespace kforge::cli {

// "ok 12 wrong_answer 3", in key order.
std::string FormatCounts(const std::map<std::string, int64_t>& counts);

// "eval 12: new best 1.234x (X=8,Y=64)" ("seed" for a candidate without params), no newline.
std::string ImprovementLine(int64_t evaluations, double best_speedup,
                            const v1::Candidate& candidate);

// The terminal's live line: "[12/100] 3.10 eval/s  best 1.234x  ok 12", no newline.
std::string StatusLine(int64_t evaluations, int64_t budget, double elapsed_seconds,
                       double best_speedup, const std::map<std::string, int64_t>& counts);

// As `kforge run` words it: "completed", "stopped" (interrupted, resumable), "cancelled" or
// "failed"; the state's name otherwise ("queued", "running").
std::string JobStateWord(v1::JobState state);

// The end-of-job line: "ID: completed (budget: max_candidates). 100 evaluations in 3.20 s; best
// speedup 6.300x (95% interval ...); ok 90 runtime_error 10", no newline (SpeedupText).
std::string JobSummaryLine(const v1::Job& job);

// "2025-01-31 14:05:09" (UTC); "-" for an unset time.
std::string FormatUtc(const google::protobuf::Timestamp& time);

}  // namespace kforge::cli
