#include "common/store/postgres_schema.h"

#include <iterator>

namespace kforge::postgres {

namespace {

// Each entry moves the schema from version i to i + 1. Never edit a shipped entry: append.
const char* const kMigrations[] = {
    R"(CREATE TABLE jobs (
         id TEXT PRIMARY KEY,
         tenant TEXT NOT NULL,
         problem_hash TEXT NOT NULL,
         state INTEGER NOT NULL,
         created_order BIGSERIAL NOT NULL,
         body BYTEA NOT NULL);
       CREATE INDEX jobs_tenant_order ON jobs(tenant, created_order DESC);
       CREATE INDEX jobs_problem ON jobs(problem_hash);
       CREATE INDEX jobs_state ON jobs(state);
       CREATE TABLE candidates (
         job_id TEXT NOT NULL REFERENCES jobs(id),
         id TEXT NOT NULL,
         content_hash TEXT NOT NULL,
         sequence BIGINT NOT NULL,
         body BYTEA NOT NULL,
         PRIMARY KEY (job_id, id),
         UNIQUE (job_id, content_hash));
       CREATE INDEX candidates_sequence ON candidates(job_id, sequence);
       CREATE TABLE evaluations (
         job_id TEXT NOT NULL,
         candidate_id TEXT NOT NULL,
         outcome INTEGER NOT NULL,
         speedup DOUBLE PRECISION NOT NULL,
         body BYTEA NOT NULL,
         PRIMARY KEY (job_id, candidate_id),
         FOREIGN KEY (job_id, candidate_id) REFERENCES candidates(job_id, id));
       CREATE TABLE events (
         job_id TEXT NOT NULL REFERENCES jobs(id),
         sequence BIGINT NOT NULL,
         body BYTEA NOT NULL,
         PRIMARY KEY (job_id, sequence));)",
    // Job versions, leases and submit idempotency; model calls; tenants and API keys.
    R"(ALTER TABLE jobs ADD COLUMN version BIGINT NOT NULL DEFAULT 1;
       ALTER TABLE jobs ADD COLUMN idempotency_key TEXT NOT NULL DEFAULT '';
       ALTER TABLE jobs ADD COLUMN lease_owner TEXT NOT NULL DEFAULT '';
       ALTER TABLE jobs ADD COLUMN lease_token BIGINT NOT NULL DEFAULT 0;
       ALTER TABLE jobs ADD COLUMN lease_expires TIMESTAMPTZ NOT NULL DEFAULT 'epoch';
       CREATE UNIQUE INDEX jobs_idempotency ON jobs(tenant, idempotency_key) WHERE idempotency_key <> '';
       CREATE TABLE model_calls (
         job_id TEXT NOT NULL REFERENCES jobs(id),
         sequence BIGINT NOT NULL,
         body BYTEA NOT NULL,
         PRIMARY KEY (job_id, sequence));
       CREATE TABLE tenants (
         name TEXT PRIMARY KEY,
         body BYTEA NOT NULL);
       CREATE TABLE api_keys (
         id TEXT PRIMARY KEY,
         tenant TEXT NOT NULL REFERENCES tenants(name),
         secret_sha256 TEXT NOT NULL UNIQUE,
         revoked BOOLEAN NOT NULL DEFAULT false,
         body BYTEA NOT NULL);
       CREATE INDEX api_keys_tenant ON api_keys(tenant);)",
    // Earlier evaluations of a candidate, found by its content hash (result reuse across jobs).
    R"(CREATE INDEX candidates_content ON candidates(content_hash);)",
    // Jobs of the same kernel on other devices and shapes (warm starts). Rows written before this
    // have no key: they are never found as history.
    R"(ALTER TABLE jobs ADD COLUMN kernel_key TEXT NOT NULL DEFAULT '';
       CREATE INDEX jobs_kernel ON jobs(tenant, kernel_key);)",
};

}  // namespace

absl::Span<const char* const> Migrations() {
  return absl::MakeConstSpan(kMigrations, std::size(kMigrations));
}

}  // namespace kforge::postgres
