// The circuit breaker on a fake clock, and the fallback mutator that uses it to keep a job going
// when its mutation service fails.

#include <memory>
#include <string>

#include "common/circuit_breaker.h"
#include "common/clock.h"
#include "common/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/coordinator/fallback_mutator.h"

namespace kforge {
namespace {

using ::testing::HasSubstr;
using State = CircuitBreaker::State;

TEST(CircuitBreakerTest, OpensAfterConsecutiveFailuresAndTriesAgainAfterACooldown) {
  FakeClock clock;
  CircuitBreaker b({.failures_to_open = 3, .cooldown_seconds = 10, .max_cooldown_seconds = 25}, clock);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(b.Allow());
    b.RecordFailure();
  }
  ASSERT_TRUE(b.Allow());
  b.RecordSuccess();  // a success resets the count
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(b.Allow());
    b.RecordFailure();
  }
  EXPECT_EQ(b.state(), State::kOpen);
  EXPECT_FALSE(b.Allow());
  EXPECT_DOUBLE_EQ(b.RetryInSeconds(), 10);
  clock.Advance(10);
  EXPECT_TRUE(b.Allow()) << "the half-open trial";
  EXPECT_FALSE(b.Allow()) << "one trial at a time";
  b.RecordFailure();
  EXPECT_DOUBLE_EQ(b.RetryInSeconds(), 20) << "a failed trial doubles the cooldown";
  clock.Advance(20);
  ASSERT_TRUE(b.Allow());
  b.RecordFailure();
  EXPECT_DOUBLE_EQ(b.RetryInSeconds(), 25) << "up to the maximum";
  clock.Advance(25);
  ASSERT_TRUE(b.Allow());
  b.RecordSuccess();
  EXPECT_EQ(b.state(), State::kClosed);
  EXPECT_TRUE(b.Allow());
}

// Answers with one child named after itself, or fails when told to.
class NamedMutator final : public Mutator {
 public:
  explicit NamedMutator(std::string name) : name_(std::move(name)) {}
  absl::StatusOr<v1::MutateResponse> Mutate(const v1::MutateRequest& req, const SeenFn&) override {
    ++calls;
    last_preferred = req.preferred();
    if (fail) return absl::UnavailableError("connection refused");
    v1::MutateResponse r;
    r.add_children()->set_note(name_);
    return r;
  }
  bool fail = false;
  int calls = 0;
  v1::MutatorKind last_preferred = v1::MUTATOR_KIND_UNSPECIFIED;

 private:
  std::string name_;
};

TEST(FallbackMutatorTest, AFailingServiceIsReplacedUntilItAnswersAgain) {
  FakeClock clock;
  auto primary = std::make_shared<NamedMutator>("proxy");
  auto fallback = std::make_shared<NamedMutator>("parametric");
  coordinator::FallbackMutator m(primary, fallback, "the proxy",
                                 {.failures_to_open = 2, .cooldown_seconds = 5, .max_cooldown_seconds = 60}, clock,
                                 MakeLogger("fallback-test", spdlog::level::off));
  const SeenFn none = [](const std::string&) { return false; };
  auto r = m.Mutate({}, none);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->children(0).note(), "proxy");
  EXPECT_TRUE(r->message().empty());

  primary->fail = true;
  r = m.Mutate({}, none);
  ASSERT_TRUE(r.ok()) << "a failed service is no error for the job";
  EXPECT_EQ(r->children(0).note(), "parametric");
  EXPECT_EQ(fallback->last_preferred, v1::MUTATOR_KIND_PARAMETRIC);
  EXPECT_THAT(r->message(), HasSubstr("the proxy failed: connection refused"));
  r = m.Mutate({}, none);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->message().empty()) << "said once per outage: " << r->message();
  EXPECT_EQ(primary->calls, 3);
  // The breaker is open: the service is not called until the cooldown is over.
  for (int i = 0; i < 4; ++i) ASSERT_EQ(m.Mutate({}, none)->children(0).note(), "parametric");
  EXPECT_EQ(primary->calls, 3);
  primary->fail = false;
  clock.Advance(5);
  r = m.Mutate({}, none);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->children(0).note(), "proxy");
  EXPECT_THAT(r->message(), HasSubstr("answers again"));
  EXPECT_EQ(m.breaker_state(), CircuitBreaker::State::kClosed);
}

}  // namespace
}  // namespace kforge
