// ExecuteRun (the sandbox's side of a run request) on a host-memory backend: outputs sent as a
// poison description are filled by the sandbox, bad descriptions are refused, inputs come back as
// a verdict when unchanged but in full when a kernel wrote them, and resident inputs are stored,
// reused by key and dropped.

#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <thread>

#include "gtest/gtest.h"
#include "services/gpu-worker/framing.h"
#include "services/gpu-worker/host_data.h"
#include "services/gpu-worker/sandbox_server.h"

namespace kforge::worker {
namespace {

// Buffers are host strings; a "kernel" is a function over the bound buffers.
class HostBackend : public DeviceBackend {
 public:
  using Kernel = std::function<void(std::vector<std::string*>&)>;
  explicit HostBackend(Kernel k) : kernel_(std::move(k)) {}

  v1::HelloResponse Init() override { return {}; }
  v1::CompileResponse Compile(const v1::CompileRequest&) override { return {}; }
  absl::StatusOr<DeviceBuf> Alloc(size_t bytes) override {
    bufs_[next_] = std::string(bytes, '\x55');
    return next_++;
  }
  void Free(DeviceBuf buf) override {
    freed_.push_back(bufs_.at(buf));
    bufs_.erase(buf);
  }
  absl::Status Clear(DeviceBuf buf, size_t bytes) override {
    if (fail_clear_) return absl::InternalError("fill failed");
    std::fill_n(bufs_.at(buf).begin(), bytes, '\0');
    return absl::OkStatus();
  }
  void FailClear() { fail_clear_ = true; }
  absl::Status Upload(DeviceBuf buf, std::string_view data) override {
    bufs_.at(buf) = std::string(data);
    return absl::OkStatus();
  }
  absl::Status Download(DeviceBuf buf, size_t bytes, char* dst) override {
    bufs_.at(buf).copy(dst, bytes);
    return absl::OkStatus();
  }
  // What each buffer held when it was freed, in order.
  const std::vector<std::string>& freed() const { return freed_; }

  absl::StatusOr<double> Launch(int, const std::vector<BoundCall>& calls) override {
    for (const auto& c : calls) {
      std::vector<std::string*> args;
      for (DeviceBuf b : c.buffers) args.push_back(b == 0 ? nullptr : &bufs_.at(b));
      kernel_(args);
    }
    if (next_time_ < times_.size()) return times_[next_time_++];
    return 1e-3;
  }
  // The times the next launches report, in order (then 1 ms each).
  void ScriptTimes(std::vector<double> times) {
    times_ = std::move(times);
    next_time_ = 0;
  }

 private:
  Kernel kernel_;
  std::map<DeviceBuf, std::string> bufs_;
  std::vector<std::string> freed_;
  bool fail_clear_ = false;
  DeviceBuf next_ = 1;
  std::vector<double> times_;
  size_t next_time_ = 0;
};

// y = x + 1 over f32, writing only the first `written` elements.
v1::RunRequest AddOneRequest(int64_t n, int pattern) {
  v1::RunRequest req;
  req.set_mode(v1::RunRequest::MODE_VALIDATE);
  auto* call = req.add_calls();
  call->set_kernel("add_one");
  call->add_args()->set_buffer("x");
  call->add_args()->set_buffer("y");
  auto* set = req.add_sets();
  auto* x = set->add_buffers();
  x->set_name("x");
  x->set_data(std::string(static_cast<size_t>(n) * 4, '\0'));  // n zeros
  x->set_check_unchanged(true);
  auto* y = set->add_buffers();
  y->set_name("y");
  y->mutable_poison()->set_dtype(v1::DTYPE_F32);
  y->mutable_poison()->set_elements(n);
  y->mutable_poison()->set_pattern(pattern);
  return req;
}

// AddOneRequest over 3 elements, timed.
v1::RunRequest AddOneBench(int warmup, int min_samples, int max_samples) {
  v1::RunRequest req = AddOneRequest(3, 0);
  req.set_mode(v1::RunRequest::MODE_BENCH);
  req.set_warmup(warmup);
  req.set_min_samples(min_samples);
  req.set_max_samples(max_samples);
  return req;
}

HostBackend::Kernel AddOne(int64_t written) {
  return [written](std::vector<std::string*>& a) {
    for (int64_t i = 0; i < written; ++i) {
      float v;
      std::memcpy(&v, a[0]->data() + i * 4, 4);
      v += 1;
      std::memcpy(a[1]->data() + i * 4, &v, 4);
    }
  };
}

const v1::BufferData* ReturnedBuffer(const v1::RunResponse& r, const std::string& name) {
  for (const auto& b : r.buffers()) {
    if (b.name() == name) return &b;
  }
  return nullptr;
}

const std::string* Returned(const v1::RunResponse& r, const std::string& name) {
  const v1::BufferData* b = ReturnedBuffer(r, name);
  return b == nullptr ? nullptr : &b->data();
}

TEST(PoisonTest, ADescriptionStandsForThePoisonBytes) {
  // f32: a NaN with a recognisable payload (pattern 0) and a huge finite value (pattern 1).
  uint32_t nan_bits = 0x7fc0dead;
  float huge = 3.0e38f;
  for (int pattern : {0, 1}) {
    v1::Poison p;
    p.set_dtype(v1::DTYPE_F32);
    p.set_elements(3);
    p.set_pattern(pattern);
    const std::string bytes = PoisonBytes(p.dtype(), p.elements(), p.pattern());
    ASSERT_EQ(bytes.size(), 12u);
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(0, std::memcmp(bytes.data() + 4 * i,
                               pattern == 0 ? static_cast<const void*>(&nan_bits) : &huge, 4))
          << "pattern " << pattern << " element " << i;
    }
    EXPECT_EQ(*PoisonSize(p, 1 << 20), 12);
  }
}

TEST(PoisonTest, OutOfRangeDescriptionsAreRefused) {
  v1::Poison p;
  p.set_dtype(v1::DTYPE_F32);
  p.set_elements(-1);
  EXPECT_FALSE(PoisonSize(p, 1 << 20).ok());
  p.set_elements((1 << 20) / 4 + 1);  // one element over the cap
  EXPECT_FALSE(PoisonSize(p, 1 << 20).ok());
  p.set_elements((1 << 20) / 4);
  EXPECT_TRUE(PoisonSize(p, 1 << 20).ok());
  p.set_dtype(v1::DTYPE_UNSPECIFIED);
  p.set_elements(4);
  auto unknown = PoisonSize(p, 1 << 20);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("DTYPE_UNSPECIFIED"), std::string::npos)
      << unknown.status();
}

TEST(SandboxRunTest, PoisonedOutputsAreFilledBySandboxAndUnwrittenElementsComeBackPoisoned) {
  for (int pattern : {0, 1}) {
    HostBackend backend(AddOne(/*written=*/3));
    ResidentStore store;
    auto r = ExecuteRun(backend, store, AddOneRequest(5, pattern));
    ASSERT_EQ(r.outcome(), v1::OUTCOME_OK) << r.message();
    const std::string* y = Returned(r, "y");
    ASSERT_NE(y, nullptr);
    ASSERT_EQ(y->size(), 20u);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(ElementAt(*y, v1::DTYPE_F32, i), 1.0) << i;
    const std::string poison = PoisonBytes(v1::DTYPE_F32, 1, pattern);
    EXPECT_EQ(y->substr(12, 4), poison);
    EXPECT_EQ(y->substr(16, 4), poison);
  }
}

TEST(SandboxRunTest, AnUnchangedInputComesBackAsAVerdictAndAChangedOneInFull) {
  ResidentStore store;
  HostBackend honest(AddOne(5));
  auto r = ExecuteRun(honest, store, AddOneRequest(5, 0));
  ASSERT_EQ(r.outcome(), v1::OUTCOME_OK) << r.message();
  const v1::BufferData* x_verdict = ReturnedBuffer(r, "x");
  ASSERT_NE(x_verdict, nullptr);
  EXPECT_TRUE(x_verdict->unchanged());
  EXPECT_TRUE(x_verdict->data().empty());

  HostBackend clobbers([](std::vector<std::string*>& a) { (*a[0])[6] = '\x01'; });
  r = ExecuteRun(clobbers, store, AddOneRequest(5, 0));
  ASSERT_EQ(r.outcome(), v1::OUTCOME_OK) << r.message();
  const std::string* x = Returned(r, "x");
  ASSERT_NE(x, nullptr);
  ASSERT_EQ(x->size(), 20u);
  EXPECT_EQ((*x)[6], '\x01');
  for (const auto& b : r.buffers()) EXPECT_FALSE(b.unchanged()) << b.name();
}

TEST(SandboxRunTest, EveryBufferIsZeroedBeforeItIsFreedButInputsCheckedUnchanged) {
  // A later kernel reading freed memory must not find this run's answers, nor what a kernel wrote
  // into its inputs; an input found to hold what was sent is public and is left as it is.
  ResidentStore store;
  HostBackend backend(AddOne(5));
  v1::RunRequest req = AddOneRequest(5, 0);
  const float two = 2;
  std::string x;
  for (int i = 0; i < 5; ++i) x.append(reinterpret_cast<const char*>(&two), 4);
  req.mutable_sets(0)->mutable_buffers(0)->set_data(x);
  auto r = ExecuteRun(backend, store, req);
  ASSERT_EQ(r.outcome(), v1::OUTCOME_OK) << r.message();
  float y0;
  std::memcpy(&y0, Returned(r, "y")->data(), 4);
  EXPECT_EQ(y0, 3.0f);
  ASSERT_EQ(backend.freed().size(), 2u);
  EXPECT_EQ(backend.freed()[0], x);                      // x, unchanged
  EXPECT_EQ(backend.freed()[1], std::string(20, '\0'));  // y

  // A kernel that writes its input: the input is zeroed too.
  HostBackend clobbers(
      [](std::vector<std::string*>& a) { std::fill(a[0]->begin(), a[0]->end(), '\x7f'); });
  r = ExecuteRun(clobbers, store, req);
  ASSERT_EQ(r.outcome(), v1::OUTCOME_OK) << r.message();
  EXPECT_EQ(*Returned(r, "x"), std::string(20, '\x7f'));
  ASSERT_EQ(clobbers.freed().size(), 2u);
  EXPECT_EQ(clobbers.freed()[0], std::string(20, '\0'));
}

TEST(SandboxRunTest, ADeviceThatCannotBeClearedCrashesTheRunAndReturnsNoResults) {
  // The worker replaces a crashed sandbox, and with it the memory that may still hold answers.
  ResidentStore store;
  HostBackend backend(AddOne(5));
  backend.FailClear();
  auto r = ExecuteRun(backend, store, AddOneRequest(5, 0));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_CRASHED);
  EXPECT_NE(r.message().find("clearing buffers"), std::string::npos) << r.message();
  EXPECT_EQ(r.buffers_size(), 0);
  EXPECT_EQ(backend.freed().size(), 2u);  // freed all the same
}

TEST(SandboxRunTest, AnOutOfRangePoisonFailsTheRunWithoutLaunching) {
  bool launched = false;
  HostBackend backend([&](std::vector<std::string*>&) { launched = true; });
  ResidentStore store;
  v1::RunRequest req = AddOneRequest(5, 0);
  req.mutable_sets(0)->mutable_buffers(1)->mutable_poison()->set_elements(-5);
  auto r = ExecuteRun(backend, store, req);
  EXPECT_NE(r.outcome(), v1::OUTCOME_OK);
  EXPECT_NE(r.message().find("poison"), std::string::npos) << r.message();
  EXPECT_FALSE(launched);
}

std::string Floats(std::initializer_list<float> v) {
  std::string out(v.size() * 4, '\0');
  std::memcpy(out.data(), std::data(v), out.size());
  return out;
}

TEST(SandboxRunTest, AResidentInputIsStoredOnceThenUsedByKeyUntilDropped) {
  HostBackend backend(AddOne(3));
  ResidentStore store;
  v1::RunRequest first = AddOneRequest(3, 0);
  auto* x = first.mutable_sets(0)->mutable_buffers(0);
  x->set_data(Floats({1, 2, 3}));
  x->set_resident_key("p/0/0/x");
  auto r = ExecuteRun(backend, store, first);
  ASSERT_EQ(r.outcome(), v1::OUTCOME_OK) << r.message();
  EXPECT_EQ(store.bytes(), 12);

  v1::RunRequest by_key = first;
  by_key.mutable_sets(0)->mutable_buffers(0)->clear_data();
  r = ExecuteRun(backend, store, by_key);
  ASSERT_EQ(r.outcome(), v1::OUTCOME_OK) << r.message();
  const std::string* y = Returned(r, "y");
  ASSERT_NE(y, nullptr);
  EXPECT_EQ(*y, Floats({2, 3, 4}));
  ASSERT_NE(ReturnedBuffer(r, "x"), nullptr);
  EXPECT_TRUE(ReturnedBuffer(r, "x")->unchanged()) << "compared with the stored copy";

  by_key.add_drop_resident("p/0/0/x");
  r = ExecuteRun(backend, store, by_key);
  EXPECT_EQ(r.outcome(), v1::OUTCOME_INFRA_ERROR)
      << "a missing key is the worker's error, not the kernel's";
  EXPECT_NE(r.message().find("p/0/0/x"), std::string::npos) << r.message();
  EXPECT_EQ(store.bytes(), 0);
}

TEST(SandboxRunTest, BenchSetsUseTheirOwnResidentInputsAndShareSetZerosOutputs) {
  HostBackend backend(AddOne(3));
  ResidentStore store;
  v1::RunRequest req = AddOneBench(/*warmup=*/1, /*min_samples=*/4, /*max_samples=*/4);
  for (int i = 0; i < 3; ++i) {
    v1::BufferSet* set = i == 0 ? req.mutable_sets(0) : req.add_sets();
    if (i > 0) set->add_buffers()->set_name("x");  // inputs only; y comes from set 0
    auto* x = set->mutable_buffers(0);
    x->set_data(Floats({10.0f * i, 10.0f * i + 1, 10.0f * i + 2}));
    x->set_resident_key("p/0/" + std::to_string(i) + "/x");
  }
  auto r = ExecuteRun(backend, store, req);
  ASSERT_EQ(r.outcome(), v1::OUTCOME_OK) << r.message();
  EXPECT_EQ(store.bytes(), 36);
  const int last = r.last_set();
  const std::string* y = Returned(r, "y");
  ASSERT_NE(y, nullptr);
  EXPECT_EQ(*y, Floats({10.0f * last + 1, 10.0f * last + 2, 10.0f * last + 3}))
      << "last set " << last;

  // Again by key alone: the same answer from the stored copies.
  for (auto& set : *req.mutable_sets()) set.mutable_buffers(0)->clear_data();
  auto again = ExecuteRun(backend, store, req);
  ASSERT_EQ(again.outcome(), v1::OUTCOME_OK) << again.message();
  EXPECT_EQ(*Returned(again, "y"), *y);
}

TEST(SandboxRunTest, RacingStopsOnceEveryOneOfRaceSamplesIsOverTheBar) {
  HostBackend backend(AddOne(3));
  ResidentStore store;
  v1::RunRequest req = AddOneBench(/*warmup=*/0, /*min_samples=*/10, /*max_samples=*/20);
  req.set_race_seconds(1e-3);  // the bar: the job's best time, with its margin
  req.set_race_samples(5);
  // Five samples over the bar: raced there, before min_samples.
  backend.ScriptTimes(std::vector<double>(20, 1.2e-3));
  auto raced = ExecuteRun(backend, store, req);
  ASSERT_EQ(raced.outcome(), v1::OUTCOME_OK) << raced.message();
  EXPECT_TRUE(raced.raced());
  EXPECT_EQ(raced.samples_seconds_size(), 5);
  // One of the five under it: timed to min_samples (min_seconds 0), not raced, though the others
  // are slower.
  std::vector<double> times(20, 1.2e-3);
  times[2] = 0.9e-3;
  backend.ScriptTimes(times);
  auto full = ExecuteRun(backend, store, req);
  ASSERT_EQ(full.outcome(), v1::OUTCOME_OK) << full.message();
  EXPECT_FALSE(full.raced());
  EXPECT_EQ(full.samples_seconds_size(), 10);
  // Four slow ones, then a fifth under the bar: the race looks only once race_samples are in.
  times.assign(20, 1.2e-3);
  times[4] = 0.5e-3;
  backend.ScriptTimes(times);
  auto late = ExecuteRun(backend, store, req);
  ASSERT_EQ(late.outcome(), v1::OUTCOME_OK) << late.message();
  EXPECT_FALSE(late.raced());
  // The earlier, coarser bar: three samples each over twice the best's time stop it at three.
  req.set_race_early_seconds(2e-3);
  req.set_race_early_samples(3);
  backend.ScriptTimes(std::vector<double>(20, 2.5e-3));
  auto early = ExecuteRun(backend, store, req);
  ASSERT_EQ(early.outcome(), v1::OUTCOME_OK) << early.message();
  EXPECT_TRUE(early.raced());
  EXPECT_EQ(early.samples_seconds_size(), 3);
  backend.ScriptTimes(std::vector<double>(20, 1.2e-3));  // under it: the five-sample bar decides
  auto main_bar = ExecuteRun(backend, store, req);
  EXPECT_TRUE(main_bar.raced());
  EXPECT_EQ(main_bar.samples_seconds_size(), 5);
}

TEST(SandboxRunTest, AResidentInoutBufferIsRestoredFromTheStoredCopyBeforeEverySample) {
  // acc += 1 in place: without a restore before each sample the result would drift.
  HostBackend backend([](std::vector<std::string*>& a) {
    for (size_t i = 0; i < a[0]->size() / 4; ++i) {
      float v;
      std::memcpy(&v, a[0]->data() + 4 * i, 4);
      v += 1;
      std::memcpy(a[0]->data() + 4 * i, &v, 4);
    }
  });
  ResidentStore store;
  v1::RunRequest req;
  req.set_mode(v1::RunRequest::MODE_BENCH);
  req.set_warmup(2);
  req.set_min_samples(5);
  req.set_max_samples(5);
  auto* call = req.add_calls();
  call->set_kernel("inc");
  call->add_args()->set_buffer("acc");
  auto* acc = req.add_sets()->add_buffers();
  acc->set_name("acc");
  acc->set_data(Floats({1, 2}));
  acc->set_restore_each_run(true);
  acc->set_resident_key("p/0/0/acc");
  auto r = ExecuteRun(backend, store, req);
  ASSERT_EQ(r.outcome(), v1::OUTCOME_OK) << r.message();
  EXPECT_EQ(*Returned(r, "acc"), Floats({2, 3}));
  acc->clear_data();
  r = ExecuteRun(backend, store, req);
  ASSERT_EQ(r.outcome(), v1::OUTCOME_OK) << r.message();
  EXPECT_EQ(*Returned(r, "acc"), Floats({2, 3}));
}

TEST(SandboxRunTest, OutputsTooLargeForAResponseAreRefusedBeforeAnyAllocation) {
  bool launched = false;
  HostBackend backend([&](std::vector<std::string*>&) { launched = true; });
  ResidentStore store;
  v1::RunRequest req = AddOneRequest(3, 0);
  auto* set = req.mutable_sets(0);
  for (int i = 0; i < 3; ++i) {  // three outputs of 512 MB each: each fits a frame, together not
    auto* b = set->add_buffers();
    b->set_name("big" + std::to_string(i));
    b->mutable_poison()->set_dtype(v1::DTYPE_U8);
    b->mutable_poison()->set_elements(int64_t{512} << 20);
  }
  auto r = ExecuteRun(backend, store, req);
  EXPECT_NE(r.outcome(), v1::OUTCOME_OK);
  EXPECT_NE(r.message().find("poison"), std::string::npos) << r.message();
  EXPECT_FALSE(launched);
}

TEST(ResidentStoreTest, AKeyAlreadyHeldIsNotStoredAgain) {
  ResidentStore store;
  ASSERT_TRUE(store.Put("k", "abc").ok());
  auto again = store.Put("k", "xyz");
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition) << again.status();
  EXPECT_EQ(*store.Get("k"), "abc");
}

TEST(ResidentStoreTest, StoredBytesAreReadOnly) {
  ResidentStore store;
  auto v = store.Put("k", "abcdef");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "abcdef");
  EXPECT_EQ(*store.Get("k"), "abcdef");
  EXPECT_DEATH(const_cast<char*>(v->data())[0] = 'z', "")
      << "a write to a resident input must fault";
  store.Drop("k");
  EXPECT_FALSE(store.Get("k").ok());
}

TEST(ResidentIndexTest, TracksOneSandboxGenerationWithinItsBudget) {
  ResidentIndex index(100);
  EXPECT_FALSE(index.Holds(1, "a"));
  EXPECT_TRUE(index.Add(1, "a", 60));
  EXPECT_TRUE(index.Holds(1, "a"));
  EXPECT_TRUE(index.TakeDrops().empty());

  // b needs room: a, least recently used and not pinned by this request, is evicted.
  EXPECT_TRUE(index.Add(1, "b", 60));
  EXPECT_EQ(index.TakeDrops(), std::vector<std::string>{"a"});
  EXPECT_FALSE(index.Holds(1, "a"));
  index.TakeDrops();

  // Within one request, a key already used is pinned: what does not fit goes without a key.
  EXPECT_TRUE(index.Holds(1, "b"));
  EXPECT_FALSE(index.Add(1, "c", 60));
  EXPECT_TRUE(index.TakeDrops().empty());
  EXPECT_TRUE(index.Holds(1, "b"));
  index.TakeDrops();

  EXPECT_FALSE(index.Add(1, "huge", 101));
  index.TakeDrops();

  // A failed run: everything is forgotten and dropped with the next request.
  EXPECT_TRUE(index.Holds(1, "b"));
  index.Abandon();
  EXPECT_EQ(index.TakeDrops(), std::vector<std::string>{"b"});
  EXPECT_FALSE(index.Holds(1, "b"));
  EXPECT_TRUE(index.Add(1, "b", 60));
  EXPECT_TRUE(index.TakeDrops().empty());

  // A new sandbox holds nothing, and has nothing to drop.
  EXPECT_FALSE(index.Holds(2, "b"));
  EXPECT_TRUE(index.Add(2, "c", 60));
  EXPECT_TRUE(index.TakeDrops().empty());
}

TEST(SandboxRunTest, LargeBuffersComeBackInTheArenaAndUnchangedInputsTakeNoRoomThere) {
  HostBackend backend(AddOne(/*written=*/4));
  ResidentStore store;
  OutputArena arena;
  v1::RunRequest req = AddOneRequest(4, 0);
  req.set_share_outputs_min_bytes(16);  // y (16 bytes) qualifies, and so does x
  auto r = ExecuteRun(backend, store, req, &arena);
  ASSERT_EQ(r.outcome(), v1::OUTCOME_OK) << r.message();
  OwnedFd file = arena.TakeNewFile();
  ASSERT_TRUE(file.valid()) << "the first arena goes to the worker";
  auto mapped = ArenaMapping::Map(file, 1 << 20);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  const v1::BufferData* y = ReturnedBuffer(r, "y");
  ASSERT_NE(y, nullptr);
  EXPECT_TRUE(y->data().empty());
  EXPECT_EQ(y->arena_bytes(), 16);
  EXPECT_EQ(mapped->bytes().substr(y->arena_offset(), 16), Floats({1, 1, 1, 1}));
  EXPECT_TRUE(ReturnedBuffer(r, "x")->unchanged());
  EXPECT_EQ(ReturnedBuffer(r, "x")->arena_bytes(), 0);

  // Cleared before the next request is served: no later kernel finds this answer.
  arena.Clear();
  EXPECT_EQ(mapped->bytes().substr(y->arena_offset(), 16), std::string(16, '\0'));

  // A kernel that writes its input: that comes back in the arena too, for the worker to judge,
  // in the same arena (it is large enough).
  HostBackend clobbers([](std::vector<std::string*>& a) { (*a[0])[0] = 'x'; });
  r = ExecuteRun(clobbers, store, req, &arena);
  ASSERT_EQ(r.outcome(), v1::OUTCOME_OK) << r.message();
  EXPECT_FALSE(arena.TakeNewFile().valid());
  const v1::BufferData* x = ReturnedBuffer(r, "x");
  EXPECT_FALSE(x->unchanged());
  ASSERT_EQ(x->arena_bytes(), 16);
  EXPECT_EQ(mapped->bytes()[x->arena_offset()], 'x');
  y = ReturnedBuffer(r, "y");
  EXPECT_NE(x->arena_offset(), y->arena_offset());

  // A run that needs more room gets a new arena.
  arena.Clear();
  v1::RunRequest bigger = AddOneRequest(1 << 20, 0);
  bigger.set_share_outputs_min_bytes(16);
  HostBackend big_backend(AddOne(1 << 20));
  r = ExecuteRun(big_backend, store, bigger, &arena);
  ASSERT_EQ(r.outcome(), v1::OUTCOME_OK) << r.message();
  OwnedFd second = arena.TakeNewFile();
  ASSERT_TRUE(second.valid());
  auto remapped = ArenaMapping::Map(second, 1 << 30);
  ASSERT_TRUE(remapped.ok()) << remapped.status();
  EXPECT_GE(remapped->bytes().size(), size_t{4} << 20);

  // Under the threshold, or without an arena, everything stays inline.
  for (int64_t min_bytes : {int64_t{17}, int64_t{0}}) {
    req.set_share_outputs_min_bytes(min_bytes);
    r = ExecuteRun(backend, store, req, &arena);
    EXPECT_EQ(ReturnedBuffer(r, "y")->arena_bytes(), 0) << min_bytes;
    EXPECT_EQ(*Returned(r, "y"), Floats({1, 1, 1, 1})) << min_bytes;
  }
  req.set_share_outputs_min_bytes(16);
  r = ExecuteRun(backend, store, req);
  EXPECT_EQ(*Returned(r, "y"), Floats({1, 1, 1, 1}));
}

TEST(SandboxRunTest, ARunWhoseBuffersCannotBeClearedNamesNothingInTheArena) {
  HostBackend backend(AddOne(4));
  backend.FailClear();
  ResidentStore store;
  OutputArena arena;
  v1::RunRequest req = AddOneRequest(4, 0);
  req.set_share_outputs_min_bytes(1);
  auto r = ExecuteRun(backend, store, req, &arena);
  EXPECT_EQ(r.outcome(), v1::OUTCOME_CRASHED);
  EXPECT_EQ(r.buffers_size(), 0);
}

// The order that keeps the arena safe, in the real serving loop: what a run left there is zeroed
// before the next request runs any kernel (which, on a CPU device, could scan the arena).
TEST(ServeSandboxTest, TheArenaIsClearedBeforeTheNextRequestRunsAKernel) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  OwnedFd worker_end(sv[0]), sandbox_end(sv[1]);
  std::string_view answer;  // the worker's view of the first run's output in the arena
  int runs = 0;
  bool zero_when_second_ran = false;
  class Available : public HostBackend {
   public:
    using HostBackend::HostBackend;
    v1::HelloResponse Init() override {
      v1::HelloResponse h;
      h.set_available(true);
      return h;
    }
  };
  BackendFactory factory = [&](v1::Backend) -> std::unique_ptr<DeviceBackend> {
    return std::make_unique<Available>([&](std::vector<std::string*>& a) {
      if (runs++ == 1) zero_when_second_ran = answer == std::string(answer.size(), '\0');
      AddOne(4)(a);
    });
  };
  std::thread server([&] { ServeSandbox(sandbox_end.get(), sandbox_end.get(), factory); });

  v1::SandboxRequest hello;
  hello.mutable_hello()->set_backend(v1::BACKEND_OPENCL);
  v1::SandboxResponse resp;
  ASSERT_TRUE(WriteFrame(worker_end.get(), hello).ok());
  ASSERT_TRUE(ReadFrame(worker_end.get(), &resp).ok());
  ASSERT_TRUE(resp.hello().available());

  v1::SandboxRequest run;
  *run.mutable_run() = AddOneRequest(4, 0);
  run.mutable_run()->set_share_outputs_min_bytes(1);
  std::vector<OwnedFd> fds;
  ASSERT_TRUE(WriteFrame(worker_end.get(), run).ok());
  ASSERT_TRUE(ReadFrameUntil(worker_end.get(), &resp, -1, &fds, 1).ok());
  ASSERT_EQ(resp.run().outcome(), v1::OUTCOME_OK) << resp.run().message();
  ASSERT_EQ(fds.size(), 1u);
  auto arena = ArenaMapping::Map(fds[0], 1 << 20);
  ASSERT_TRUE(arena.ok()) << arena.status();
  const v1::BufferData* y = ReturnedBuffer(resp.run(), "y");
  ASSERT_NE(y, nullptr);
  ASSERT_EQ(y->arena_bytes(), 16);
  answer = arena->bytes().substr(y->arena_offset(), 16);
  EXPECT_EQ(answer, Floats({1, 1, 1, 1}));

  ASSERT_TRUE(WriteFrame(worker_end.get(), run).ok());
  fds.clear();
  ASSERT_TRUE(ReadFrameUntil(worker_end.get(), &resp, -1, &fds, 1).ok());
  EXPECT_TRUE(fds.empty()) << "the same arena, reused";
  worker_end = OwnedFd();  // end of input: the server returns
  server.join();
  EXPECT_EQ(runs, 2);
  EXPECT_TRUE(zero_when_second_ran);
}

}  // namespace
}  // namespace kforge::worker
