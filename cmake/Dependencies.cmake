# Debian 12 quirks: protobuf in module mode, gRPC / prometheus-cpp / absl in config mode,
# hiredis and libpqxx through pkg-config.
find_package(Threads REQUIRED)
find_package(Protobuf REQUIRED)
find_package(absl CONFIG REQUIRED)
find_package(gRPC CONFIG REQUIRED)
find_package(fmt CONFIG REQUIRED)
find_package(spdlog CONFIG REQUIRED)
find_package(yaml-cpp CONFIG REQUIRED)
find_package(nlohmann_json CONFIG REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
find_package(OpenSSL REQUIRED)
find_package(ZLIB REQUIRED)
find_package(SQLite3 REQUIRED)
find_package(prometheus-cpp CONFIG REQUIRED)
# Boost.Asio (header-only): the coordinator's event loop.
find_package(Boost 1.74 CONFIG REQUIRED COMPONENTS headers)
find_package(PkgConfig REQUIRED)
pkg_check_modules(HIREDIS REQUIRED IMPORTED_TARGET hiredis)
pkg_check_modules(PQXX REQUIRED IMPORTED_TARGET libpqxx)

find_program(GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)

set(KFORGE_HAVE_OPENCL OFF)
if(KFORGE_WITH_OPENCL)
  find_package(OpenCL)
  if(OpenCL_FOUND)
    set(KFORGE_HAVE_OPENCL ON)
  endif()
endif()

# CUDA: only the headers and NVRTC are needed at build time; the driver API is loaded with dlopen
# at run time so binaries start on machines without a driver.
set(KFORGE_HAVE_CUDA OFF)
if(KFORGE_WITH_CUDA)
  if(NOT CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND AND TARGET CUDA::nvrtc)
    set(KFORGE_HAVE_CUDA ON)
  endif()
endif()
