// DeviceBackend::Fill on the OpenCL device (in this process: PoCL on CPUs) and a CUDA one where
// there is one: a poisoned output filled from one element on the device holds exactly the bytes
// the worker would have sent, for every element width and for lengths that are not a multiple of
// the wide fill pattern; and Clear zeroes.

#include "gtest/gtest.h"
#include "services/gpu-worker/cuda_backend.h"
#include "services/gpu-worker/host_data.h"
#include "services/gpu-worker/opencl_backend.h"

namespace kforge::worker {
namespace {

void ExpectFillsMatchThePoisonBytes(DeviceBackend& backend) {
  for (v1::DType dtype :
       {v1::DTYPE_U8, v1::DTYPE_F16, v1::DTYPE_F32, v1::DTYPE_F64, v1::DTYPE_I64}) {
    for (int pattern : {0, 1}) {
      for (int64_t n : {1, 33, 4099}) {
        SCOPED_TRACE(testing::Message()
                     << v1::DType_Name(dtype) << " pattern " << pattern << " n " << n);
        const std::string want = PoisonBytes(dtype, n, pattern);
        auto buf = backend.Alloc(want.size());
        ASSERT_TRUE(buf.ok()) << buf.status();
        ASSERT_TRUE(backend.Upload(*buf, std::string(want.size(), '\x11')).ok());
        ASSERT_TRUE(backend.Fill(*buf, want.size(), PoisonBytes(dtype, 1, pattern)).ok());
        std::string got(want.size(), '\0');
        ASSERT_TRUE(backend.Download(*buf, got.size(), got.data()).ok());
        EXPECT_EQ(got, want);
        ASSERT_TRUE(backend.Clear(*buf, want.size()).ok());  // a fill of zero bytes
        ASSERT_TRUE(backend.Download(*buf, got.size(), got.data()).ok());
        EXPECT_EQ(got, std::string(want.size(), '\0'));
        backend.Free(*buf);
      }
    }
  }
  // A length that is not a multiple of the element is refused, not half-filled.
  auto buf = backend.Alloc(10);
  ASSERT_TRUE(buf.ok());
  EXPECT_FALSE(backend.Fill(*buf, 10, std::string(4, '\x7f')).ok());
  backend.Free(*buf);
}

TEST(DeviceFillTest, OpenClFillsMatchThePoisonBytes) {
  std::unique_ptr<DeviceBackend> backend = MakeOpenClBackend();
  if (backend == nullptr) GTEST_SKIP() << "OpenCL not built in";
  const v1::HelloResponse hello = backend->Init();
  if (!hello.available()) GTEST_SKIP() << "no OpenCL device: " << hello.unavailable_reason();
  ExpectFillsMatchThePoisonBytes(*backend);
}

// Run by scripts/gpu-check.sh on a GPU machine (cuMemsetD8/D16/D32, and D2D32 for 8 bytes).
TEST(DeviceFillTest, CudaFillsMatchThePoisonBytes) {
  std::unique_ptr<DeviceBackend> backend = MakeCudaBackend();
  if (backend == nullptr) GTEST_SKIP() << "CUDA not built in";
  const v1::HelloResponse hello = backend->Init();
  if (!hello.available()) GTEST_SKIP() << "no CUDA device: " << hello.unavailable_reason();
  ExpectFillsMatchThePoisonBytes(*backend);
}

}  // namespace
}  // namespace kforge::worker
