#pragma once

// Following a job on a kforge-coordinator: `kforge watch JOB` and `kforge submit --watch`.

#include <string>

#include "absl/strings/string_view.h"
#include "cli/coordinator_client.h"
#include "kforge/v1/job.pb.h"

namespace kforge::cli {

struct WatchOptions {
  // A dropped stream is opened again from the last event seen + 1, after a pause that doubles
  // from `first_backoff_seconds` up to `max_backoff_seconds` (and starts over once events flow).
  double first_backoff_seconds = 0.5;
  double max_backoff_seconds = 10;
  // Watching gives up when the coordinator has sent nothing for this long through a run of
  // failed reconnections.
  double give_up_seconds = 600;
};

// "job ID: NAME (STATE), budget N evaluations, on SERVER", no newline.
std::string WatchHeader(const v1::Job& job, const std::string& server);

// Streams the job's events and prints them as `kforge run` does (a plain line per improvement, a
// live status line on a terminal) until the job ends, then its summary line. Exit code: 0 when it
// completed or was cancelled, 1 when it failed or watching failed, 2 for a refused token.
int WatchUntilEnd(CoordinatorClient& client, absl::string_view command, const v1::Job& job,
                  const WatchOptions& options = {});

}  // namespace kforge::cli
