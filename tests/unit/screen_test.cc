// The include screen: every spelling a preprocessor honours is seen, on both backends, and honest
// kernels (the examples, C++ raw strings, digit separators) pass.

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "services/gpu-worker/screen.h"

namespace kforge::worker {
namespace {

const char kKernel[] = "__kernel void k(__global float* c) { c[get_global_id(0)] = 1.0f; }\n";

std::vector<std::string> HostileSpellings() {
  return {
      "#include \"/etc/passwd\"\n",
      "#include </etc/passwd>\n",
      "  #  include \"/etc/passwd\"\n",
      "# /* hidden */ include \"/etc/passwd\"\n",
      "/* a comment\n that ends */ #include \"/etc/passwd\"\n",
      "%:include \"/etc/passwd\"\n",
      "?" "?=include \"/etc/passwd\"\n",
      "#\\\ninclude \"/etc/passwd\"\n",
      "#inc\\\nlude \"/etc/passwd\"\n",
      "#inc\\ \t\nlude \"/etc/passwd\"\n",
      "#inc?" "?/\nlude \"/etc/passwd\"\n",
      "#define P \"/etc/passwd\"\n#include P\n",
      "#include_next </etc/passwd>\n",
      "#import \"/etc/passwd\"\n",
      "#embed \"/etc/passwd\"\n",
      "#if __has_include(\"/etc/passwd\")\n#endif\n",
      "#if __has_embed(\"/etc/passwd\")\n#endif\n",
      "#pragma GCC dependency \"/etc/passwd\"\n",
      // Line breaks: a bare carriage return, CR LF, form feed and vertical tab before the '#'.
      "int x;\r#include \"/etc/passwd\"\n",
      "int x;\r\n#include \"/etc/passwd\"\r\n",
      "\f\v#include \"/etc/passwd\"\n",
      "#include \"/etc/passwd\"\r",
      // A byte-order mark, alone and before a carriage return.
      "\xEF\xBB\xBF#include \"/etc/passwd\"\n",
      "\xEF\xBB\xBF\r#include \"/etc/passwd\"\n",
      // Comment openers inside literals open nothing.
      "const char* s = \"/*\";\n#include \"/etc/passwd\"\n// */\n",
      "char q = '\"'; const char* s = \"/*\";\n#include \"/etc/passwd\"\n// */\n",
      // A trigraph splice that a compiler without trigraphs does not make, and one that it does.
      "int y; // ?" "?/\n#include \"/etc/passwd\"\n",
      // Encodings other than UTF-8 and control characters.
      std::string("\xFF\xFE#\0i\0n\0c\0", 10),
      std::string("\xFE\xFF\0#\0i\0n\0c", 10),
      "\x1b#include \"/etc/passwd\"\n",
      "int z; /* \xC0\xAF */\n",
      "int z; /* \xED\xA0\x80 */\n",
  };
}

TEST(ScreenTest, EveryHostileSpellingIsRefusedOnBothBackends) {
  for (const v1::Backend backend : {v1::BACKEND_OPENCL, v1::BACKEND_CUDA}) {
    for (const auto& s : HostileSpellings()) {
      EXPECT_FALSE(ScreenIncludes(backend, s + kKernel).ok())
          << (backend == v1::BACKEND_CUDA ? "cuda: " : "opencl: ") << s;
    }
  }
}

TEST(ScreenTest, ErrorsNameTheLine) {
  absl::Status st = ScreenIncludes(v1::BACKEND_OPENCL, "int a;\r\nint b;\r#include <x>\n");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(std::string(st.message()).find("line 3"), std::string::npos) << st;
}

TEST(ScreenTest, HonestSourcesPass) {
  const std::vector<std::string> honest = {
      kKernel,
      std::string("\xEF\xBB\xBF") + kKernel,  // a byte-order mark alone is fine
      "// a comment with an #include in it\n" + std::string(kKernel),
      "/* #include \"/etc/passwd\" */\n" + std::string(kKernel),
      "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n#pragma unroll 4\n" + std::string(kKernel),
      "int k(void) { return '#'; }\r\n#define A 1\r\n",
      "// café: UTF-8 text is fine\n" + std::string(kKernel),
  };
  for (const auto& s : honest) EXPECT_TRUE(ScreenIncludes(v1::BACKEND_OPENCL, s).ok()) << s;
  // CUDA: allow-listed headers, a raw string that holds an #include line, digit separators.
  EXPECT_TRUE(ScreenIncludes(v1::BACKEND_CUDA, "#include <cuda_fp16.h>\n__global__ void k() {}\n").ok());
  EXPECT_TRUE(ScreenIncludes(v1::BACKEND_CUDA,
                             "const char* s = R\"x(\n#include \"/etc/passwd\"\n)x\";\nint n = 1'000'000;\n")
                  .ok());
  // OpenCL C has no raw strings: the same text there holds a real #include line.
  EXPECT_FALSE(ScreenIncludes(v1::BACKEND_OPENCL, "const char* s = R\"x(\n#include \"/etc/passwd\"\n)x\";\n").ok());
}

TEST(ScreenTest, LongInputsAreLinear) {
  // Megabytes of whitespace, one huge line, deep comment nesting: no recursion, no crash.
  std::string spaces(1 << 20, ' ');
  EXPECT_TRUE(ScreenIncludes(v1::BACKEND_OPENCL, spaces + kKernel).ok());
  std::string line = "#error " + std::string(1 << 20, 'x') + "\n";
  EXPECT_TRUE(ScreenIncludes(v1::BACKEND_OPENCL, line).ok());
  std::string splices;
  for (int i = 0; i < 100000; ++i) splices += "\\\n";
  EXPECT_FALSE(ScreenIncludes(v1::BACKEND_OPENCL, "#" + splices + "include </etc/passwd>\n").ok());
}

}  // namespace
}  // namespace kforge::worker
