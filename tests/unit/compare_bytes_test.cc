// CompareBytes decides whether a candidate computed the right answer: tolerance, non-finite
// values, sizes, and the error summary the worker reports.

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "services/gpu-worker/host_data.h"

namespace kforge::worker {
namespace {

template <typename T>
std::string Bytes(const std::vector<T>& v) {
  std::string out(v.size() * sizeof(T), '\0');
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(CompareBytesTest, WithinAbsolutePlusRelativeToleranceIsOk) {
  // |got - want| <= atol + rtol * |want|: 0.1 + 0.01 * 100 = 1.1 allowed at 100.
  auto r = CompareBytes(Bytes<float>({101.0f, -1.05f}), Bytes<float>({100.0f, -1.0f}),
                        v1::DTYPE_F32, 0.1, 0.01);
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(r.mismatches, 0);
  EXPECT_EQ(r.first_mismatch, -1);
  EXPECT_NEAR(r.max_abs_error, 1.0, 1e-6);
  EXPECT_NEAR(r.max_rel_error, 0.05, 1e-6);
}

TEST(CompareBytesTest, MismatchesAreCountedWithTheFirstOneReported) {
  auto r =
      CompareBytes(Bytes<float>({1, 5, 3, 9}), Bytes<float>({1, 2, 3, 4}), v1::DTYPE_F32, 0.5, 0);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.mismatches, 2);
  EXPECT_EQ(r.first_mismatch, 1);
  EXPECT_EQ(r.got_at_first, 5);
  EXPECT_EQ(r.want_at_first, 2);
  EXPECT_EQ(r.max_abs_error, 5);
}

TEST(CompareBytesTest, NonFiniteResultsFailWhereTheReferenceIsFinite) {
  for (float bad : {kNan, kInf, -kInf}) {
    auto r = CompareBytes(Bytes<float>({1, bad}), Bytes<float>({1, 2}), v1::DTYPE_F32, 1e9, 1e9);
    EXPECT_FALSE(r.ok) << bad << " must not pass however loose the tolerance";
    EXPECT_EQ(r.first_mismatch, 1);
    EXPECT_TRUE(std::isinf(r.max_abs_error));
  }
}

TEST(CompareBytesTest, NonFiniteReferenceValuesMustBeMatchedExactly) {
  EXPECT_TRUE(
      CompareBytes(Bytes<float>({kNan, kInf}), Bytes<float>({kNan, kInf}), v1::DTYPE_F32, 0, 0).ok);
  EXPECT_FALSE(
      CompareBytes(Bytes<float>({0, kInf}), Bytes<float>({kNan, kInf}), v1::DTYPE_F32, 1e9, 1e9)
          .ok);
  EXPECT_FALSE(
      CompareBytes(Bytes<float>({kNan, -kInf}), Bytes<float>({kNan, kInf}), v1::DTYPE_F32, 1e9, 1e9)
          .ok);
}

TEST(CompareBytesTest, ASizeMismatchFailsEveryElement) {
  auto r = CompareBytes(Bytes<float>({1, 2}), Bytes<float>({1, 2, 3}), v1::DTYPE_F32, 1, 1);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.mismatches, 3);
  EXPECT_EQ(r.first_mismatch, 0);
}

TEST(CompareBytesTest, IntegersCompareExactlyAtZeroTolerance) {
  EXPECT_TRUE(CompareBytes(Bytes<int32_t>({-7, 1 << 30}), Bytes<int32_t>({-7, 1 << 30}),
                           v1::DTYPE_I32, 0, 0)
                  .ok);
  auto r = CompareBytes(Bytes<int32_t>({-7, (1 << 30) + 1}), Bytes<int32_t>({-7, 1 << 30}),
                        v1::DTYPE_I32, 0, 0);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.first_mismatch, 1);
  EXPECT_TRUE(
      CompareBytes(Bytes<uint8_t>({0, 255}), Bytes<uint8_t>({0, 255}), v1::DTYPE_U8, 0, 0).ok);
  EXPECT_FALSE(
      CompareBytes(Bytes<uint8_t>({0, 254}), Bytes<uint8_t>({0, 255}), v1::DTYPE_U8, 0, 0).ok);
}

TEST(CompareBytesTest, HalfPrecisionIsComparedAsItsValue) {
  const std::string want = Bytes<uint16_t>({FloatToHalf(1.0f), FloatToHalf(-2.5f)});
  EXPECT_TRUE(CompareBytes(Bytes<uint16_t>({FloatToHalf(1.0f), FloatToHalf(-2.5f)}), want,
                           v1::DTYPE_F16, 0, 0)
                  .ok);
  auto r = CompareBytes(Bytes<uint16_t>({FloatToHalf(1.0f), FloatToHalf(-2.0f)}), want,
                        v1::DTYPE_F16, 0.1, 0);
  EXPECT_FALSE(r.ok);
  EXPECT_NEAR(r.max_abs_error, 0.5, 1e-6);
}

TEST(CompareBytesTest, PoisonNeverMatchesAnAnswer) {
  // Unwritten outputs hold poison: NaN-like (pattern 0) or huge (pattern 1); neither may pass.
  const std::string want = Bytes<float>({0.0f, 1.0f, -3.0e38f, 3.0e38f});
  for (int pattern : {0, 1}) {
    const std::string poison = PoisonBytes(v1::DTYPE_F32, 4, pattern);
    auto r = CompareBytes(poison, want, v1::DTYPE_F32, 1e-3, 1e-3);
    EXPECT_FALSE(r.ok) << "pattern " << pattern;
  }
  // Between them the two patterns fail every element, whatever the reference holds there.
  auto r0 = CompareBytes(PoisonBytes(v1::DTYPE_F32, 4, 0), want, v1::DTYPE_F32, 1e-3, 1e-3);
  EXPECT_EQ(r0.mismatches, 4) << "a NaN fails everywhere the reference is finite";
}

}  // namespace
}  // namespace kforge::worker
