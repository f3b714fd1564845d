#pragma once

// Content hashes for dedupe and caches: hex SHA-256.

#include "absl/strings/string_view.h"
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "kforge/v1/candidate.pb.h"
#include "kforge/v1/problem.pb.h"

struct evp_md_ctx_st;  // OpenSSL's EVP_MD_CTX

namespace kforge {

std::string Sha256Hex(absl::string_view data);
// Hex SHA-1, only where another system names things by it (Redis's scripts): not for our hashes.
std::string Sha1Hex(absl::string_view data);

// Removes comments and white space that cannot change how the code reads (a single space is kept
// only between two words, two operator characters, two literals, or a word and a quote), so
// that a candidate that differs from another only in formatting or comments hashes the same:
// "a=b+1" and "a = b + 1" are one candidate. String and character literals are kept verbatim; preprocessor
// lines keep their line breaks and a single space wherever they had space (a continued line is
// one line). Then unused macro definitions go: a "#define NAME ..." (object- or function-like)
// whose NAME appears nowhere else outside comments and literals (#ifdef NAME, defined(NAME) and
// #undef NAME are uses) is never expanded, so a candidate that only adds one is a duplicate.
// Conservative where that is not certain: only definitions after the last #include, none at all
// in a source with ## or _Pragma, and none that could fail to compile (reserved names,
// malformed parameter lists or bodies).
//
// Changing this function changes content hashes: candidates stored by an older version keep
// their old hash (sources with an unused #define, or a line continuation before a CRLF, hashed
// differently before), so a new child that differs from such a stored candidate only that way
// is not recognised as its duplicate. Nothing else depends on stored hashes matching today's.
std::string NormaliseSource(absl::string_view source);

// Hash of everything in the problem except content_hash itself.
std::string HashProblem(const v1::Problem& problem);

// The kernel a problem tunes, whatever its sizes, checks and reference: the backend, the seed's
// normalised source and its knob names. Jobs with the same kernel key on other devices or shapes
// are the history a job's warm start draws on.
std::string HashKernel(const v1::Problem& problem);

// Hash of normalised source + launch plan + params (sorted). Ids, lineage and timestamps do not
// count: two candidates with the same hash compute the same thing the same way.
std::string HashCandidate(const v1::Candidate& candidate);

// The params as the candidate hash reads them: "name=value\n" per param, in name order.
std::string ParamsText(const std::map<std::string, int64_t>& sorted_params);

// HashCandidate for runs of candidates that share a source and plan (the knob variants of one
// parent): the source is normalised once per run, not once per variant. Same values as
// HashCandidate. Not thread-safe: one per caller.
class CandidateHasher {
 public:
  CandidateHasher();
  ~CandidateHasher();
  CandidateHasher(const CandidateHasher&) = delete;
  CandidateHasher& operator=(const CandidateHasher&) = delete;
  std::string Hash(const v1::Candidate& candidate);
  // Makes `base` (its source and plan) the base of HashParams.
  void Prime(const v1::Candidate& base);
  // The hash the primed base would have with `params` in place of its own, without copying it: a
  // mutator trying knob variants of one parent primes once and pays only for the params per try.
  std::string HashParams(const std::map<std::string, int64_t>& sorted_params);
  // The same, from ParamsText(sorted_params).
  std::string HashParamsText(absl::string_view params_text);
  // A hash of the primed base alone (its source and plan): variants of two bases with the same
  // BaseKey have the same hashes.
  std::string BaseKey();

 private:
  struct CtxDeleter {
    void operator()(evp_md_ctx_st* ctx) const;
  };
  std::string source_, plan_;  // the last source and serialised plan
  bool plan_empty_ = true;     // the last candidate had no plan
  bool primed_ = false;
  // SHA-256 with what they contribute to the hashed text absorbed: a variant hashes only its
  // params on top.
  std::unique_ptr<evp_md_ctx_st, CtxDeleter> prefix_;
  std::unique_ptr<evp_md_ctx_st, CtxDeleter> work_;
};

}  // namespace kforge
