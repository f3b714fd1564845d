#include "services/coordinator/coordinator_service.h"

#include <atomic>
#include <chrono>
#include <deque>
#include <optional>
#include <string_view>

#include "grpcpp/alarm.h"

namespace kforge::coordinator {

namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

std::optional<std::string_view> Authorization(const grpc::CallbackServerContext* ctx) {
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return std::nullopt;
  return std::string_view(it->second.data(), it->second.size());
}

// Authenticates, runs `fn(caller)` and finishes the call with its status.
template <typename Fn>
grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* ctx, Authenticator& auth, Fn fn) {
  auto* reactor = ctx->DefaultReactor();
  absl::StatusOr<Caller> caller = auth.AuthenticateTenant(Authorization(ctx));
  reactor->Finish(caller.ok() ? ToGrpc(fn(*caller)) : ToGrpc(caller.status()));
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* CoordinatorServiceImpl::SubmitJob(grpc::CallbackServerContext* ctx,
                                                            const v1::SubmitJobRequest* req,
                                                            v1::SubmitJobResponse* resp) {
  return Unary(ctx, auth_, [&](const Caller& c) -> absl::Status {
    absl::StatusOr<v1::Job> job = api_.Submit(c, *req);
    if (job.ok()) *resp->mutable_job() = *std::move(job);
    return job.status();
  });
}

grpc::ServerUnaryReactor* CoordinatorServiceImpl::GetJob(grpc::CallbackServerContext* ctx, const v1::GetJobRequest* req,
                                                         v1::Job* resp) {
  return Unary(ctx, auth_, [&](const Caller& c) -> absl::Status {
    absl::StatusOr<v1::Job> job = api_.Get(c, req->job_id());
    if (job.ok()) *resp = *std::move(job);
    return job.status();
  });
}

grpc::ServerUnaryReactor* CoordinatorServiceImpl::ListJobs(grpc::CallbackServerContext* ctx,
                                                           const v1::ListJobsRequest* req, v1::ListJobsResponse* resp) {
  return Unary(ctx, auth_, [&](const Caller& c) -> absl::Status {
    absl::StatusOr<v1::ListJobsResponse> r = api_.List(c, *req);
    if (r.ok()) *resp = *std::move(r);
    return r.status();
  });
}

grpc::ServerUnaryReactor* CoordinatorServiceImpl::CancelJob(grpc::CallbackServerContext* ctx,
                                                            const v1::CancelJobRequest* req, v1::Job* resp) {
  return Unary(ctx, auth_, [&](const Caller& c) -> absl::Status {
    absl::StatusOr<v1::Job> job = api_.Cancel(c, *req);
    if (job.ok()) *resp = *std::move(job);
    return job.status();
  });
}

grpc::ServerUnaryReactor* CoordinatorServiceImpl::ListCandidates(grpc::CallbackServerContext* ctx,
                                                                 const v1::ListCandidatesRequest* req,
                                                                 v1::ListCandidatesResponse* resp) {
  return Unary(ctx, auth_, [&](const Caller& c) -> absl::Status {
    absl::StatusOr<v1::ListCandidatesResponse> r = api_.Candidates(c, *req);
    if (r.ok()) *resp = *std::move(r);
    return r.status();
  });
}

grpc::ServerUnaryReactor* CoordinatorServiceImpl::GetBest(grpc::CallbackServerContext* ctx,
                                                          const v1::GetBestRequest* req, v1::GetBestResponse* resp) {
  return Unary(ctx, auth_, [&](const Caller& c) -> absl::Status {
    absl::StatusOr<v1::GetBestResponse> r = api_.Best(c, req->job_id());
    if (r.ok()) *resp = *std::move(r);
    return r.status();
  });
}

grpc::ServerUnaryReactor* CoordinatorServiceImpl::ListWorkers(grpc::CallbackServerContext* ctx,
                                                              const v1::ListWorkersRequest*,
                                                              v1::ListWorkersResponse* resp) {
  return Unary(ctx, auth_, [&](const Caller& c) -> absl::Status {
    absl::StatusOr<v1::ListWorkersResponse> r = api_.Workers(c);
    if (r.ok()) *resp = *std::move(r);
    return r.status();
  });
}

// Polls the job's events with an alarm (no thread per stream): writes what is new one event at a
// time, and finishes once the job has ended and every event went out, or the client left.
class CoordinatorServiceImpl::WatchReactor final : public grpc::ServerWriteReactor<v1::JobEvent> {
 public:
  WatchReactor(JobApi& api, Caller caller, std::string job_id, int64_t from, double poll_seconds)
      : api_(api), caller_(std::move(caller)), job_id_(std::move(job_id)), next_(std::max<int64_t>(1, from)),
        poll_seconds_(poll_seconds) {
    Poll();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
      return;
    }
    WriteNextOrPoll();
  }
  void OnCancel() override { cancelled_ = true; }
  void OnDone() override { delete this; }

 private:
  void Poll() {
    if (cancelled_) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
      return;
    }
    absl::StatusOr<JobApi::EventPage> page = api_.Events(caller_, job_id_, next_, 100);
    if (!page.ok()) {
      Finish(ToGrpc(page.status()));
      return;
    }
    ended_ = page->ended;
    for (auto& e : page->events) {
      next_ = e.sequence() + 1;
      pending_.push_back(std::move(e));
    }
    if (page->events.size() == 100) ended_ = false;  // more to read before the end
    WriteNextOrPoll();
  }

  void WriteNextOrPoll() {
    if (!pending_.empty()) {
      current_ = std::move(pending_.front());
      pending_.pop_front();
      StartWrite(&current_);
      return;
    }
    if (ended_) {
      Finish(grpc::Status::OK);
      return;
    }
    alarm_.Set(std::chrono::system_clock::now() + std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                                      std::chrono::duration<double>(poll_seconds_)),
               [this](bool) { Poll(); });
  }

  JobApi& api_;
  const Caller caller_;
  const std::string job_id_;
  int64_t next_;
  const double poll_seconds_;
  std::atomic<bool> cancelled_{false};
  bool ended_ = false;
  std::deque<v1::JobEvent> pending_;
  v1::JobEvent current_;
  grpc::Alarm alarm_;
};

grpc::ServerWriteReactor<v1::JobEvent>* CoordinatorServiceImpl::WatchJob(grpc::CallbackServerContext* ctx,
                                                                         const v1::WatchJobRequest* req) {
  absl::StatusOr<Caller> caller = auth_.AuthenticateTenant(Authorization(ctx));
  if (!caller.ok()) {
    // A reactor that only finishes.
    class Refused final : public grpc::ServerWriteReactor<v1::JobEvent> {
     public:
      explicit Refused(const absl::Status& s) { Finish(ToGrpc(s)); }
      void OnDone() override { delete this; }
    };
    return new Refused(caller.status());
  }
  return new WatchReactor(api_, *std::move(caller), req->job_id(), req->from_sequence(), watch_poll_seconds_);
}

}  // namespace kforge::coordinator
