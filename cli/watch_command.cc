#include "cli/watch_command.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <map>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/progress_lines.h"
#include "common/launch.h"
#include "services/coordinator/job_runner.h"

namespace kforge::cli {

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Prints events: plain lines always, and on a terminal a status line that the next one redraws.
class EventPrinter {
 public:
  EventPrinter(const v1::Job& job, bool tty)
      : budget_(job.spec().budget().max_candidates()), tty_(tty) {
    if (job.has_progress()) progress_ = job.progress();
  }

  void Print(const v1::JobEvent& ev) {
    if (ev.has_progress()) progress_ = ev.progress();
    switch (ev.event_case()) {
      case v1::JobEvent::kStateChanged:
        // The end of the job has its summary line instead.
        if (!coordinator::IsFinalJobState(ev.state_changed())) {
          Line(absl::StrCat("state: ", JobStateWord(ev.state_changed())));
        }
        break;
      case v1::JobEvent::kImproved:
        if (ev.has_progress()) {
          Line(ImprovementLine(progress_.evaluations(), progress_.best_speedup(), ev.improved()));
        } else {  // a server that sends no counts with it: the candidate alone, no stale numbers
          const ParamAssignment params(ev.improved().params().begin(),
                                       ev.improved().params().end());
          Line(absl::StrCat("new best: candidate ", ev.improved().id(), " (",
                            params.empty() ? "seed" : FormatParams(params), ")"));
        }
        break;
      case v1::JobEvent::kMessage:
        Line(ev.message());
        break;
      case v1::JobEvent::kEvaluated:
      case v1::JobEvent::EVENT_NOT_SET:
        break;
    }
    if (tty_ && ev.has_progress()) {
      const std::map<std::string, int64_t> counts(progress_.outcome_counts().begin(),
                                                  progress_.outcome_counts().end());
      std::cout << "\r\033[K"
                << StatusLine(progress_.evaluations(), budget_, progress_.elapsed_seconds(),
                              progress_.best_speedup(), counts)
                << std::flush;
      status_shown_ = true;
    }
  }

  // A line of its own, clearing the status line first.
  void Line(const std::string& text) {
    if (status_shown_) std::cout << "\r\033[K";
    status_shown_ = false;
    std::cout << text << "\n" << std::flush;
  }

  void Finish() {
    if (status_shown_) std::cout << "\n";
    status_shown_ = false;
  }

 private:
  int64_t budget_;
  bool tty_;
  bool status_shown_ = false;
  v1::JobProgress progress_;
};

}  // namespace

std::string WatchHeader(const v1::Job& job, const std::string& server) {
  std::string budget;
  const v1::Budget& b = job.spec().budget();
  if (b.max_candidates() > 0)
    absl::StrAppend(&budget, ", budget ", b.max_candidates(), " evaluations");
  if (b.max_wall_seconds() > 0) absl::StrAppend(&budget, ", time ", b.max_wall_seconds(), " s");
  return absl::StrCat("job ", job.id(), ": ", job.spec().problem().name(), " (",
                      JobStateWord(job.state()), ")", budget, ", on ", server);
}

int WatchUntilEnd(CoordinatorClient& client, absl::string_view command, const v1::Job& job,
                  const WatchOptions& options) {
  EventPrinter printer(job, isatty(STDOUT_FILENO) != 0);
  int64_t last_sequence = 0;
  double backoff = options.first_backoff_seconds;
  double failing_since = -1;  // when the current run of fruitless streams began; -1 = none
  while (true) {
    v1::WatchJobRequest req;
    req.set_job_id(job.id());
    req.set_from_sequence(last_sequence + 1);
    auto ctx = client.NewContext(/*stream=*/true);
    std::unique_ptr<grpc::ClientReaderInterface<v1::JobEvent>> reader =
        client.stub().WatchJob(ctx.get(), req);
    v1::JobEvent ev;
    bool got_events = false;
    while (reader->Read(&ev)) {
      if (ev.sequence() <= last_sequence) continue;  // a server that resent what we have
      last_sequence = ev.sequence();
      got_events = true;
      printer.Print(ev);
    }
    const grpc::Status status = reader->Finish();
    if (got_events) {
      failing_since = -1;
      backoff = options.first_backoff_seconds;
    }
    std::string why;
    if (status.ok()) {
      // The stream ends when the job does; a server shutting down may end it sooner.
      v1::GetJobRequest get;
      get.set_job_id(job.id());
      v1::Job now;
      auto get_ctx = client.NewContext();
      const grpc::Status got = client.stub().GetJob(get_ctx.get(), get, &now);
      if (got.ok() && coordinator::IsFinalJobState(now.state())) {
        printer.Finish();
        std::cout << JobSummaryLine(now) << "\n";
        return now.state() == v1::JOB_STATE_FAILED ? 1 : 0;
      }
      if (!got.ok() && !IsRetryableStreamError(got.error_code())) {
        printer.Finish();
        return client.Fail(command, got);
      }
      why = got.ok() ? "the stream ended before the job did" : client.Describe(got);
      if (got.ok()) failing_since = -1;  // the coordinator answers: it is only the stream
    } else if (!IsRetryableStreamError(status.error_code())) {
      printer.Finish();
      return client.Fail(command, status);
    } else {
      why =
          absl::StrCat("the stream broke (",
                       absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())),
                       ": ", status.error_message(), ")");
    }
    const double now = Now();
    if (failing_since < 0) failing_since = now;
    if (now - failing_since > options.give_up_seconds) {
      printer.Finish();
      std::cerr << "kforge " << command << ": giving up after "
                << absl::StrFormat("%.0f", now - failing_since)
                << " s without the coordinator: " << why << "\n";
      return 1;
    }
    printer.Finish();
    std::cerr << "kforge " << command << ": " << why << "; watching again from event "
              << last_sequence + 1 << " in " << absl::StrFormat("%.1f", backoff) << " s\n";
    std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
    backoff = std::min(backoff * 2, options.max_backoff_seconds);
  }
}

}  // namespace kforge::cli
