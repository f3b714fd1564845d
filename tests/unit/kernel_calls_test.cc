// ToCalls: a resolved launch plan as the sandbox's kernel calls, with typed scalar arguments and
// clear errors for what cannot be expressed.

#include "services/gpu-worker/kernel_calls.h"

#include "gtest/gtest.h"
#include "services/gpu-worker/host_data.h"

namespace kforge::worker {
namespace {

LaunchArg Arg(LaunchArg::Kind kind, const std::string& name, int64_t value = 0) {
  LaunchArg a;
  a.kind = kind;
  a.name = name;
  a.value = value;
  return a;
}

v1::Problem WithScalars() {
  v1::Problem p;
  auto* alpha = p.add_scalars();
  alpha->set_name("alpha");
  alpha->set_dtype(v1::DTYPE_F32);
  alpha->set_value(0.5);
  auto* h = p.add_scalars();
  h->set_name("h");
  h->set_dtype(v1::DTYPE_F16);
  h->set_value(2.0);
  return p;
}

TEST(KernelCallsTest, ArgumentsKeepTheirKindAndType) {
  ResolvedLaunch l;
  l.kernel = "axpy";
  l.grid = {4, 1, 1};
  l.block = {256, 1, 1};
  l.shared_bytes = 1024;
  l.args = {Arg(LaunchArg::Kind::kBuffer, "x"), Arg(LaunchArg::Kind::kScalar, "alpha"),
            Arg(LaunchArg::Kind::kScalar, "h"), Arg(LaunchArg::Kind::kInt, "N", 1000)};
  auto calls = ToCalls({l, l}, WithScalars());
  ASSERT_TRUE(calls.ok()) << calls.status();
  ASSERT_EQ(calls->size(), 2u);
  const v1::KernelCall& c = (*calls)[0];
  EXPECT_EQ(c.kernel(), "axpy");
  EXPECT_EQ(c.grid_size(), 3);
  EXPECT_EQ(c.block(0), 256);
  EXPECT_EQ(c.shared_bytes(), 1024);
  ASSERT_EQ(c.args_size(), 4);
  EXPECT_EQ(c.args(0).buffer(), "x");
  EXPECT_FLOAT_EQ(c.args(1).f32(), 0.5f);
  EXPECT_EQ(c.args(2).f16_bits(), FloatToHalf(2.0f));
  EXPECT_EQ(c.args(3).i32(), 1000);
  EXPECT_EQ(KernelNames({l, l}), std::vector<std::string>{"axpy"});
}

TEST(KernelCallsTest, WhatCannotBeExpressedIsNamed) {
  ResolvedLaunch big;
  big.kernel = "k";
  big.args = {Arg(LaunchArg::Kind::kInt, "N * N", int64_t{1} << 40)};
  auto r = ToCalls({big}, WithScalars());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("N * N"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("i32"), std::string::npos) << r.status();

  ResolvedLaunch unknown;
  unknown.kernel = "k";
  unknown.args = {Arg(LaunchArg::Kind::kScalar, "beta")};
  r = ToCalls({unknown}, WithScalars());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("unknown scalar 'beta'"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace kforge::worker
