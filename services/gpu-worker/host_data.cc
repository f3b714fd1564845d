#include "services/gpu-worker/host_data.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/status_macros.h"

namespace kforge::worker {

float HalfToFloat(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) return sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0);
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // overflow to infinity
  if (abs < 0x33000000u) return sign;              // underflow to zero
  int exp = static_cast<int>(abs >> 23) - 127 + 15;
  uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
  if (exp <= 0) {  // subnormal half
    const int shift = 14 - exp;
    uint32_t r = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) ++r;
    return sign | static_cast<uint16_t>(r);
  }
  uint32_t r = ((static_cast<uint32_t>(exp) << 10) | ((mant >> 13) & 0x3ffu));
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1))) ++r;  // round to nearest even
  return sign | static_cast<uint16_t>(r);
}

float Bf16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

namespace {

template <typename T>
T Load(const std::string& bytes, int64_t i) {
  T v;
  std::memcpy(&v, bytes.data() + i * sizeof(T), sizeof(T));
  return v;
}

template <typename T>
void Store(std::string& bytes, int64_t i, T v) {
  std::memcpy(bytes.data() + i * sizeof(T), &v, sizeof(T));
}

// A float outside an integer type's range has no defined conversion: clamp first.
template <typename T>
T ClampTo(double v) {
  if (std::isnan(v)) return T{0};
  constexpr double lo = static_cast<double>(std::numeric_limits<T>::lowest());
  constexpr double hi = static_cast<double>(std::numeric_limits<T>::max());
  if (v <= lo) return std::numeric_limits<T>::lowest();
  if (v >= hi) return std::numeric_limits<T>::max();
  return static_cast<T>(v);
}

void StoreDouble(std::string& bytes, v1::DType dtype, int64_t i, double v) {
  switch (dtype) {
    case v1::DTYPE_F16: Store<uint16_t>(bytes, i, FloatToHalf(static_cast<float>(v))); break;
    case v1::DTYPE_BF16: Store<uint16_t>(bytes, i, FloatToBf16(static_cast<float>(v))); break;
    case v1::DTYPE_F32: Store<float>(bytes, i, static_cast<float>(v)); break;
    case v1::DTYPE_F64: Store<double>(bytes, i, v); break;
    case v1::DTYPE_I32: Store<int32_t>(bytes, i, ClampTo<int32_t>(v)); break;
    case v1::DTYPE_I64: Store<int64_t>(bytes, i, ClampTo<int64_t>(v)); break;
    case v1::DTYPE_U8: Store<uint8_t>(bytes, i, ClampTo<uint8_t>(v)); break;
    default: KF_CHECK(false);
  }
}

}  // namespace

double ElementAt(const std::string& bytes, v1::DType dtype, int64_t i) {
  switch (dtype) {
    case v1::DTYPE_F16: return HalfToFloat(Load<uint16_t>(bytes, i));
    case v1::DTYPE_BF16: return Bf16ToFloat(Load<uint16_t>(bytes, i));
    case v1::DTYPE_F32: return Load<float>(bytes, i);
    case v1::DTYPE_F64: return Load<double>(bytes, i);
    case v1::DTYPE_I32: return Load<int32_t>(bytes, i);
    case v1::DTYPE_I64: return static_cast<double>(Load<int64_t>(bytes, i));
    case v1::DTYPE_U8: return Load<uint8_t>(bytes, i);
    default: KF_CHECK(false);
  }
  return 0;
}

std::string FillBytes(v1::DType dtype, int64_t n, const v1::Fill& fill, std::mt19937_64& rng) {
  std::string bytes(static_cast<size_t>(n * DTypeSize(dtype)), '\0');
  switch (fill.kind()) {
    case v1::Fill::KIND_CONSTANT:
      for (int64_t i = 0; i < n; ++i) StoreDouble(bytes, dtype, i, fill.a());
      break;
    case v1::Fill::KIND_ARANGE:
      for (int64_t i = 0; i < n; ++i) StoreDouble(bytes, dtype, i, fill.a() + i * fill.b());
      break;
    case v1::Fill::KIND_NORMAL: {
      std::normal_distribution<double> d(fill.a(), fill.b());
      for (int64_t i = 0; i < n; ++i) StoreDouble(bytes, dtype, i, d(rng));
      break;
    }
    case v1::Fill::KIND_RANDINT: {
      std::uniform_int_distribution<int64_t> d(static_cast<int64_t>(fill.a()), static_cast<int64_t>(fill.b()));
      for (int64_t i = 0; i < n; ++i) StoreDouble(bytes, dtype, i, static_cast<double>(d(rng)));
      break;
    }
    case v1::Fill::KIND_UNIFORM:
    default: {
      const double lo = fill.kind() == v1::Fill::KIND_UNIFORM ? fill.a() : -1;
      const double hi = fill.kind() == v1::Fill::KIND_UNIFORM ? fill.b() : 1;
      std::uniform_real_distribution<double> d(lo, hi);
      if (IsFloatDType(dtype)) {
        for (int64_t i = 0; i < n; ++i) StoreDouble(bytes, dtype, i, d(rng));
      } else {
        for (int64_t i = 0; i < n; ++i) StoreDouble(bytes, dtype, i, std::floor(d(rng)));
      }
      break;
    }
  }
  return bytes;
}

absl::StatusOr<int64_t> PoisonSize(const v1::Poison& poison, int64_t max_bytes) {
  const int64_t size = DTypeSize(poison.dtype());
  if (size <= 0 || poison.elements() < 0 || poison.elements() > max_bytes / size) {
    return absl::InvalidArgumentError(absl::StrCat("poison of ", poison.elements(), " elements of ",
                                                   v1::DType_Name(poison.dtype()),
                                                   " is out of range"));
  }
  return poison.elements() * size;
}

std::string PoisonBytes(v1::DType dtype, int64_t n, int pattern) {
  std::string bytes(static_cast<size_t>(n * DTypeSize(dtype)), '\0');
  switch (dtype) {
    case v1::DTYPE_F16:
    case v1::DTYPE_BF16: {
      const uint16_t v = pattern == 0 ? (dtype == v1::DTYPE_F16 ? 0x7e01u : 0x7fc1u)
                                      : (dtype == v1::DTYPE_F16 ? 0x7bffu : 0x7f7fu);  // max finite
      for (int64_t i = 0; i < n; ++i) Store<uint16_t>(bytes, i, v);
      break;
    }
    case v1::DTYPE_F32: {
      uint32_t bits = 0x7fc0dead;
      float v;
      std::memcpy(&v, &bits, 4);
      if (pattern != 0) v = 3.0e38f;
      for (int64_t i = 0; i < n; ++i) Store<float>(bytes, i, v);
      break;
    }
    case v1::DTYPE_F64: {
      const double v = pattern == 0 ? std::numeric_limits<double>::quiet_NaN() : 1.5e308;
      for (int64_t i = 0; i < n; ++i) Store<double>(bytes, i, v);
      break;
    }
    case v1::DTYPE_I32:
      for (int64_t i = 0; i < n; ++i) Store<int32_t>(bytes, i, pattern == 0 ? int32_t{-559038737} : int32_t{1234567891});
      break;
    case v1::DTYPE_I64:
      for (int64_t i = 0; i < n; ++i) Store<int64_t>(bytes, i, pattern == 0 ? int64_t{-2401053088876216593} : int64_t{8070450532247928831});
      break;
    case v1::DTYPE_U8:
      std::memset(bytes.data(), pattern == 0 ? 0xA5 : 0x5A, bytes.size());
      break;
    default:
      KF_CHECK(false);
  }
  return bytes;
}

namespace {

// One element of the comparison; `r` accumulates.
inline void CompareElement(double g, double w, int64_t i, double atol, double rtol,
                           CompareResult& r) {
  if (g == w && std::isfinite(w)) return;  // exact: no error to record (the common case)
  bool bad;
  double abs_err = 0;
  if (!std::isfinite(w)) {
    bad = !(std::isnan(w) ? std::isnan(g) : g == w);
    abs_err = bad ? std::numeric_limits<double>::infinity() : 0;
  } else if (!std::isfinite(g)) {
    bad = true;
    abs_err = std::numeric_limits<double>::infinity();
  } else {
    abs_err = std::fabs(g - w);
    bad = abs_err > atol + rtol * std::fabs(w);
    const double rel = std::fabs(w) > 0 ? abs_err / std::fabs(w) : abs_err;
    r.max_rel_error = std::max(r.max_rel_error, rel);
  }
  r.max_abs_error = std::max(r.max_abs_error, abs_err);
  if (bad) {
    if (r.first_mismatch < 0) {
      r.first_mismatch = i;
      r.got_at_first = g;
      r.want_at_first = w;
    }
    ++r.mismatches;
  }
}

// The element loop for one storage type: no per-element dispatch on the dtype.
template <typename T, typename ToDouble>
void CompareTyped(std::string_view got, std::string_view want, int64_t n, double atol, double rtol,
                  ToDouble to_double, CompareResult& r) {
  const char* g = got.data();
  const char* w = want.data();
  for (int64_t i = 0; i < n; ++i) {
    T gv, wv;
    std::memcpy(&gv, g + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
    std::memcpy(&wv, w + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
    CompareElement(to_double(gv), to_double(wv), i, atol, rtol, r);
  }
}

}  // namespace

CompareResult CompareBytes(std::string_view got, std::string_view want, v1::DType dtype,
                           double atol, double rtol) {
  CompareResult r;
  const int64_t n = static_cast<int64_t>(want.size()) / DTypeSize(dtype);
  if (got.size() != want.size()) {
    r.ok = false;
    r.mismatches = n;
    r.first_mismatch = 0;
    return r;
  }
  auto as_double = [](auto v) { return static_cast<double>(v); };
  switch (dtype) {
    case v1::DTYPE_F16:
      CompareTyped<uint16_t>(got, want, n, atol, rtol, HalfToFloat, r);
      break;
    case v1::DTYPE_BF16:
      CompareTyped<uint16_t>(got, want, n, atol, rtol, Bf16ToFloat, r);
      break;
    case v1::DTYPE_F32:
      CompareTyped<float>(got, want, n, atol, rtol, as_double, r);
      break;
    case v1::DTYPE_F64:
      CompareTyped<double>(got, want, n, atol, rtol, as_double, r);
      break;
    case v1::DTYPE_I32:
      CompareTyped<int32_t>(got, want, n, atol, rtol, as_double, r);
      break;
    case v1::DTYPE_I64:
      CompareTyped<int64_t>(got, want, n, atol, rtol, as_double, r);
      break;
    case v1::DTYPE_U8:
      CompareTyped<uint8_t>(got, want, n, atol, rtol, as_double, r);
      break;
    default:
      KF_CHECK(false);
  }
  r.ok = r.mismatches == 0;
  return r;
}

}  // namespace kforge::worker
