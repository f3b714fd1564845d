#pragma once

#include "services/coordinator/layer.h"

// CoordinatorService over gRPC: thin handlers that authenticate the caller (bearer token in the
// "authorization" metadata) and call JobApi. WatchJob streams a job's events from a sequence
// number, polling the store, until the job ends or the client goes; a client that lost the stream
// resumes from the last sequence it saw + 1.

#include "grpcpp/grpcpp.h"
#include "kforge/v1/coordinator.grpc.pb.h"
#include "services/coordinator/auth.h"
#include "services/coordinator/job_api.h"

namespace kforge::coordinator {

class CoordinatorServiceImpl final : public v1::CoordinatorService::CallbackService {
 public:
  CoordinatorServiceImpl(JobApi& api, Authenticator& auth, double watch_poll_seconds = 0.2)
      : api_(api), auth_(auth), watch_poll_seconds_(watch_poll_seconds) {}

  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* ctx, const v1::SubmitJobRequest* req,
                                      v1::SubmitJobResponse* resp) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* ctx, const v1::GetJobRequest* req,
                                   v1::Job* resp) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx, const v1::ListJobsRequest* req,
                                     v1::ListJobsResponse* resp) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* ctx, const v1::CancelJobRequest* req,
                                      v1::Job* resp) override;
  grpc::ServerWriteReactor<v1::JobEvent>* WatchJob(grpc::CallbackServerContext* ctx,
                                                   const v1::WatchJobRequest* req) override;
  grpc::ServerUnaryReactor* ListCandidates(grpc::CallbackServerContext* ctx, const v1::ListCandidatesRequest* req,
                                           v1::ListCandidatesResponse* resp) override;
  grpc::ServerUnaryReactor* GetBest(grpc::CallbackServerContext* ctx, const v1::GetBestRequest* req,
                                    v1::GetBestResponse* resp) override;
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* ctx, const v1::ListWorkersRequest* req,
                                        v1::ListWorkersResponse* resp) override;

 private:
  class WatchReactor;

  JobApi& api_;
  Authenticator& auth_;
  const double watch_poll_seconds_;
};

}  // namespace kforge::coordinator
