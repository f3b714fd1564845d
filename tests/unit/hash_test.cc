#include "common/hash.h"

#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kforge/v1/candidate.pb.h"
#include "kforge/v1/problem.pb.h"

namespace kforge {
namespace {

TEST(Sha1HexTest, KnownVectors) {
  EXPECT_EQ(Sha1Hex(""), "da39a3ee5e6b4b0d3255bfef95601890afd80709");
  EXPECT_EQ(Sha1Hex("abc"), "a9993e364706816aba3e25717850c26c9cd0d89d");
}

TEST(Sha256HexTest, KnownVectors) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256HexTest, BinaryDataAndFormat) {
  const std::string with_nul("a\0b", 3);
  const std::string h = Sha256Hex(with_nul);
  EXPECT_EQ(h.size(), 64u);
  EXPECT_EQ(h.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(h, Sha256Hex("a"));  // the NUL and what follows count
  EXPECT_NE(h, Sha256Hex("ab"));
}

// ---------------------------------------------------------------------------------------------

TEST(NormaliseSourceTest, FoldsWhiteSpace) {
  EXPECT_EQ(NormaliseSource("int  a =\n\t1;\r\n  int b;\n"), "int a=1;int b;");
  EXPECT_EQ(NormaliseSource("   leading"), "leading");
  EXPECT_EQ(NormaliseSource("trailing   \n\n"), "trailing");
  EXPECT_EQ(NormaliseSource(""), "");
  EXPECT_EQ(NormaliseSource(" \n\t "), "");
}

TEST(NormaliseSourceTest, RemovesComments) {
  EXPECT_EQ(NormaliseSource("int a; // the a\nint b; // the b"), "int a;int b;");
  EXPECT_EQ(NormaliseSource("int /* inline */ a;"), "int a;");
  // A block comment separates tokens like white space does.
  EXPECT_EQ(NormaliseSource("int/**/a;"), "int a;");
  EXPECT_EQ(NormaliseSource("/* header\n * spanning lines\n */\nkernel void f() {}"),
            "kernel void f(){}");
  EXPECT_EQ(NormaliseSource("x = 1; /* unterminated"), "x=1;");
  EXPECT_EQ(NormaliseSource("a = b / c; // divide"), "a=b/c;");
}

TEST(NormaliseSourceTest, KeepsStringAndCharLiteralsVerbatim) {
  EXPECT_EQ(NormaliseSource("printf(\"a  //  b\");   // real comment"), "printf(\"a  //  b\");");
  EXPECT_EQ(NormaliseSource("s = \"/* not a comment */\";"), "s=\"/* not a comment */\";");
  EXPECT_EQ(NormaliseSource("s = \"tab\tand  spaces\";"), "s=\"tab\tand  spaces\";");
  EXPECT_EQ(NormaliseSource("s = \"esc \\\" //still\";  x"), "s=\"esc \\\" //still\";x");
  EXPECT_EQ(NormaliseSource("c = '/'; d = '\\''; // c"), "c='/';d='\\'';");
  EXPECT_EQ(NormaliseSource("c = ' ';"), "c=' ';");
  // A change inside a literal is a change.
  EXPECT_NE(NormaliseSource("s = \"a b\";"), NormaliseSource("s = \"a  b\";"));
}

TEST(NormaliseSourceTest, PreprocessorLinesKeepLineBreaks) {
  EXPECT_EQ(NormaliseSource("#define A 1\n#define B 2\nkernel void f() { g(A, B); }"),
            "#define A 1\n#define B 2\nkernel void f(){g(A,B);}");
  EXPECT_EQ(NormaliseSource("int a;\n  #ifdef X\nint b;\n#endif\nint c;"),
            "int a;\n#ifdef X\nint b;\n#endif\nint c;");
  EXPECT_EQ(NormaliseSource("#define   TILE    16   // tile\n\n\nint x[TILE];"),
            "#define TILE 16\nint x[TILE];");
  // A continued directive stays one line, with a LF or a CRLF line end.
  EXPECT_EQ(NormaliseSource("#define M(a) \\\n  ((a) * 2)\nint x = M(1);"), "#define M(a) ((a) * 2)\nint x=M(1);");
  EXPECT_EQ(NormaliseSource("#define M(a) \\\r\n  ((a) * 2)\r\nint x = M(1);"),
            "#define M(a) ((a) * 2)\nint x=M(1);");
  // '#' inside a line is not a directive.
  EXPECT_EQ(NormaliseSource("a = 1; b = \"#x\";\nc = 2;"), "a=1;b=\"#x\";c=2;");
}

TEST(NormaliseSourceTest, DropsSpaceOnlyWhereItCannotMatter) {
  EXPECT_EQ(NormaliseSource("a=b+1;"), NormaliseSource("a = b + 1 ;"));
  EXPECT_EQ(NormaliseSource("f( x , y )[ 2 ]"), "f(x,y)[2]");
  // Words stay apart, and operators that would fuse into another token stay apart.
  EXPECT_EQ(NormaliseSource("unsigned  int x"), "unsigned int x");
  EXPECT_EQ(NormaliseSource("a - -b"), "a- -b");
  EXPECT_NE(NormaliseSource("a - -b"), NormaliseSource("a--b"));
  EXPECT_EQ(NormaliseSource("a + +b"), "a+ +b");
  EXPECT_EQ(NormaliseSource("x = a / *p;"), "x=a/ *p;");
  EXPECT_EQ(NormaliseSource("vector<vector<int> > v"), "vector<vector<int> >v");
  EXPECT_EQ(NormaliseSource("x = 1 .5"), "x=1 .5");
  // A word beside a quote is a literal prefix or suffix: L"x" is not L "x".
  EXPECT_EQ(NormaliseSource("w = L \"x\";"), "w=L \"x\";");
  EXPECT_NE(NormaliseSource("w = L \"x\";"), NormaliseSource("w = L\"x\";"));
  // Inside a directive every space is kept: F(x) is a function-like macro, F (x) is not.
  EXPECT_EQ(NormaliseSource("#define F (x)\nint y = F;"), "#define F (x)\nint y=F;");
  EXPECT_NE(NormaliseSource("#define F (x)\nint y = F(1);"), NormaliseSource("#define F(x)\nint y = F(1);"));
}

TEST(NormaliseSourceTest, FormattingOnlyDifferencesNormaliseTheSame) {
  const std::string a =
      "// Matrix multiply\n"
      "#define TILE 16\n"
      "kernel void f(global float* x, int n) {\n"
      "  int i = get_global_id(0);  /* index */\n"
      "  if (i < n) x[i] = 2.0f * x[i];\n"
      "}\n";
  const std::string b =
      "#define TILE 16   \n"
      "kernel void f(global float* x,\n"
      "              int n)\n"
      "{\n"
      "\tint i = get_global_id(0);\n"
      "\n"
      "\tif (i < n)   x[i] = 2.0f * x[i];   // scale\n"
      "}";
  EXPECT_EQ(NormaliseSource(a), NormaliseSource(b));
  EXPECT_NE(NormaliseSource(a), NormaliseSource(a + "int y;"));
}

// Unused macro definitions: a "#define NAME" whose NAME appears nowhere else is never expanded.

constexpr const char* kKernel =
    "kernel void f(global float* x, int n) {\n"
    "  int i = get_global_id(0);\n"
    "  if (i < n) x[i] = 2.0f * x[i];\n"
    "}\n";

TEST(NormaliseSourceTest, DropsAnUnusedDefine) {
  const std::string base = NormaliseSource(kKernel);
  EXPECT_EQ(NormaliseSource(std::string("#define UNUSED 42\n") + kKernel), base);
  EXPECT_EQ(NormaliseSource(std::string(kKernel) + "#define AT_THE_END 1\n"), base);
  EXPECT_EQ(NormaliseSource(std::string("  #  define   SPACED(a, b)  ((a) + (b))\n") + kKernel), base);
  EXPECT_EQ(NormaliseSource(std::string("#define EMPTY\n#define VARIADIC(...) f(__VA_ARGS__)\n") + kKernel), base);
  // Self-reference is not a use; neither is a use inside another unused definition.
  EXPECT_EQ(NormaliseSource(std::string("#define SELF (SELF + 1)\n") + kKernel), base);
  EXPECT_EQ(NormaliseSource(std::string("#define INNER 4\n#define OUTER (INNER * 2)\n") + kKernel), base);
}

TEST(NormaliseSourceTest, KeepsAUsedDefine) {
  const std::string used = "#define SCALE 2.0f\nkernel void f(global float* x) { x[0] = SCALE * x[0]; }\n";
  EXPECT_THAT(NormaliseSource(used), ::testing::HasSubstr("#define SCALE 2.0f"));
  EXPECT_NE(NormaliseSource(used), NormaliseSource("kernel void f(global float* x) { x[0] = SCALE * x[0]; }\n"));
  // A use inside another, used, definition.
  const std::string chained = std::string("#define INNER 4\n#define OUTER (INNER * 2)\nint k = OUTER;\n") + kKernel;
  EXPECT_THAT(NormaliseSource(chained), ::testing::HasSubstr("#define INNER 4"));
  // A function-like macro called in the code.
  EXPECT_THAT(NormaliseSource(std::string("#define SQ(v) ((v) * (v))\nint k = SQ(3);\n") + kKernel),
              ::testing::HasSubstr("#define SQ(v)"));
  // A name that is only part of another word is not a use: TILE_X does not use TILE.
  EXPECT_EQ(NormaliseSource(std::string("#define TILE 16\nint TILE_X = 1;\n") + kKernel),
            NormaliseSource(std::string("int TILE_X = 1;\n") + kKernel));
}

TEST(NormaliseSourceTest, UsesInOtherDirectivesCount) {
  for (const std::string use : {"#ifdef FAST\nint k = 1;\n#endif\n", "#ifndef FAST\nint k = 1;\n#endif\n",
                                "#if defined(FAST)\nint k = 1;\n#endif\n", "#if FAST > 0\nint k;\n#endif\n",
                                "#undef FAST\n", "#define FAST 2\n", "#pragma unroll FAST\n"}) {
    const std::string with = std::string("#define FAST 1\n") + use + kKernel;
    EXPECT_THAT(NormaliseSource(with), ::testing::HasSubstr("#define FAST 1")) << use;
    EXPECT_NE(NormaliseSource(with), NormaliseSource(use + kKernel)) << use;
  }
}

TEST(NormaliseSourceTest, DropsAContinuedUnusedDefineWhole) {
  const std::string base = NormaliseSource(kKernel);
  EXPECT_EQ(NormaliseSource(std::string("#define LONG(a, b) \\\n  do {        \\\n    (a) += (b); \\\n  } while (0)\n") +
                            kKernel),
            base);
  EXPECT_EQ(NormaliseSource(std::string("#define LONG(a) \\\r\n  ((a) * 2)\r\n") + kKernel), base);
  // Nothing of its continuation lines is left behind, even words that look like uses elsewhere.
  EXPECT_EQ(NormaliseSource(std::string("#define PAIR \\\n  get_global_id(0), n\n") + kKernel), base);
}

TEST(NormaliseSourceTest, NamesInLiteralsAndCommentsAreNotUses) {
  const std::string base = NormaliseSource(std::string("const char* s = \"QUIET\"; char c = 'Q';\n") + kKernel);
  EXPECT_EQ(NormaliseSource(std::string("#define QUIET 1\n#define Q 2\nconst char* s = \"QUIET\"; char c = 'Q';\n") +
                            kKernel),
            base);
  EXPECT_EQ(NormaliseSource(std::string("#define QUIET 1 // QUIET\n/* QUIET */ const char* s = \"QUIET\"; "
                                        "char c = 'Q'; // uses QUIET? no\n") +
                            kKernel),
            base);
  // Numbers are not names: 1e5f and 0x1Fu mention no macro f, e5f or u.
  EXPECT_EQ(NormaliseSource(std::string("#define e5f 3\n#define u 4\nfloat a = 1e5f + 0x1Fu + 1'000;\n") + kKernel),
            NormaliseSource(std::string("float a = 1e5f + 0x1Fu + 1'000;\n") + kKernel));
}

TEST(NormaliseSourceTest, KeepsDefinesThatCannotSafelyGo) {
  auto kept = [](const std::string& src, const std::string& line) {
    return NormaliseSource(src).find(line) != std::string::npos;
  };
  // Before an #include: the header may test it.
  EXPECT_TRUE(kept("#define __CUDA_NO_HALF_OPERATORS__\n#include <cuda_fp16.h>\n", "#define __CUDA_NO_HALF_OPERATORS__"));
  EXPECT_TRUE(kept("#define MY_CONFIG 1\n#include <cuda_fp16.h>\nint k;\n", "#define MY_CONFIG 1"));
  EXPECT_FALSE(kept("#include <cuda_fp16.h>\n#define MY_CONFIG 1\nint k;\n", "#define MY_CONFIG 1"));
  // Token pasting can form any name; _Pragma reads its string.
  EXPECT_TRUE(kept("#define X_1 5\n#define CAT(a, b) a##b\nint k = CAT(X_, 1);\n", "#define X_1 5"));
  EXPECT_TRUE(kept("#define N 4\n_Pragma(\"unroll N\")\nint k;\n", "#define N 4"));
  // Reserved names, and definitions that may not compile even unused.
  EXPECT_TRUE(kept("#define _Reserved 1\nint k;\n", "#define _Reserved 1"));
  EXPECT_TRUE(kept("#define __reserved 1\nint k;\n", "#define __reserved 1"));
  EXPECT_TRUE(kept("#define BAD(a, a) a\nint k;\n", "#define BAD(a, a) a"));
  EXPECT_TRUE(kept("#define BAD(a,\nint k;\n", "#define BAD(a,"));
  EXPECT_TRUE(kept("#define STR(a) #b\nint k;\n", "#define STR(a) #b"));
  EXPECT_TRUE(kept("#define ARGS(a) __VA_ARGS__\nint k;\n", "#define ARGS(a) __VA_ARGS__"));
  EXPECT_TRUE(kept("#define QUOTE 'x\nint k;\n", "#define QUOTE 'x"));
  EXPECT_TRUE(kept("#define PLUS+1\nint k;\n", "#define PLUS+1"));
}

// ---------------------------------------------------------------------------------------------

v1::Candidate SampleCandidate() {
  v1::Candidate c;
  c.set_id("cand-1");
  c.set_job_id("job-1");
  c.set_source("kernel void k(global float* x) {\n  x[0] = 1.0f; // one\n}\n");
  v1::Launch* l = c.mutable_plan()->add_launches();
  l->set_kernel("k");
  l->add_global("N");
  l->add_local("TILE");
  l->add_args("x");
  v1::ScratchBuffer* s = c.mutable_plan()->add_scratch();
  s->set_name("tmp");
  s->set_dtype(v1::DTYPE_F32);
  s->add_shape("N");
  (*c.mutable_params())["TILE"] = 16;
  (*c.mutable_params())["WPT"] = 4;
  (*c.mutable_params())["PAD"] = 1;
  c.add_parent_ids("p-1");
  c.set_mutator(v1::MUTATOR_KIND_LLM);
  c.set_island(2);
  c.set_generation(7);
  c.mutable_created_at()->set_seconds(1700000000);
  c.set_note("tiled");
  return c;
}

TEST(HashCandidateTest, IsHexSha256AndStable) {
  const std::string h = HashCandidate(SampleCandidate());
  EXPECT_EQ(h.size(), 64u);
  EXPECT_EQ(h.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(h, HashCandidate(SampleCandidate()));
}

// What a candidate's hash is of, spelled out: stored hashes must not change with how it is computed.
std::string HashByDefinition(const v1::Candidate& c) {
  std::string plan;
  c.plan().SerializeToString(&plan);  // one launch, no maps: deterministic anyway
  std::string text = absl::StrCat("source\n", NormaliseSource(c.source()), "\nplan\n", plan, "\nparams\n");
  std::map<std::string, int64_t> sorted(c.params().begin(), c.params().end());
  for (const auto& [k, v] : sorted) absl::StrAppend(&text, k, "=", v, "\n");
  return Sha256Hex(text);
}

TEST(HashCandidateTest, OneHasherOverManyCandidatesGivesEachItsOwnHash) {
  CandidateHasher hasher;
  v1::Candidate a = SampleCandidate();
  v1::Candidate b = a;
  (*b.mutable_params())["TILE"] = 32;
  v1::Candidate other_source = a;
  other_source.set_source(a.source() + "\nkernel void extra() {}");
  v1::Candidate other_plan = a;
  other_plan.mutable_plan()->mutable_launches(0)->set_kernel("other");
  v1::Candidate no_params = a;
  no_params.clear_params();
  // Variants of one source, then another source and plan, and back: none reuses a stale prefix.
  for (const v1::Candidate* c : {&a, &b, &other_source, &a, &other_plan, &b, &no_params, &a}) {
    EXPECT_EQ(hasher.Hash(*c), HashByDefinition(*c));
    EXPECT_EQ(hasher.Hash(*c), HashCandidate(*c));
  }
  EXPECT_NE(hasher.Hash(a), hasher.Hash(b));
  EXPECT_NE(hasher.Hash(a), hasher.Hash(other_plan));
}

TEST(HashCandidateTest, HashParamsIsTheHashOfThePrimedBaseWithThoseParams) {
  CandidateHasher hasher;
  const v1::Candidate a = SampleCandidate();
  v1::Candidate no_plan = a;
  no_plan.clear_plan();
  v1::Candidate empty_plan = no_plan;
  empty_plan.mutable_plan();  // set, but serialises like none
  for (const v1::Candidate* base : std::vector<const v1::Candidate*>{&a, &no_plan, &empty_plan, &a, &empty_plan, &no_plan}) {
    hasher.Prime(*base);
    for (const std::map<std::string, int64_t>& params :
         {std::map<std::string, int64_t>{}, std::map<std::string, int64_t>{{"TILE", 32}},
          std::map<std::string, int64_t>{{"TILE", 8}, {"WPT", 4}}}) {
      v1::Candidate variant = *base;
      variant.clear_params();
      for (const auto& [k, v] : params) (*variant.mutable_params())[k] = v;
      EXPECT_EQ(hasher.HashParams(params), HashByDefinition(variant));
    }
  }
}

TEST(HashCandidateTest, SameForFormattingOnlyDifferences) {
  v1::Candidate a = SampleCandidate();
  v1::Candidate b = SampleCandidate();
  b.set_source("// a comment\nkernel void k(global float* x)\n{\n\tx[0] = 1.0f;\n}");
  EXPECT_EQ(HashCandidate(a), HashCandidate(b));
}

TEST(HashCandidateTest, IndependentOfIdsLineageAndTimestamps) {
  const std::string base = HashCandidate(SampleCandidate());
  v1::Candidate c = SampleCandidate();
  c.set_id("another-id");
  c.set_job_id("another-job");
  c.clear_parent_ids();
  c.add_parent_ids("x");
  c.add_parent_ids("y");
  c.set_island(5);
  c.set_generation(100);
  c.mutable_created_at()->set_seconds(1);
  c.set_note("different note");
  c.set_content_hash("stale");
  c.set_mutator(v1::MUTATOR_KIND_PARAMETRIC);
  EXPECT_EQ(HashCandidate(c), base);
}

TEST(HashCandidateTest, IndependentOfParamInsertionOrder) {
  v1::Candidate a = SampleCandidate();
  v1::Candidate b = SampleCandidate();
  b.clear_params();
  (*b.mutable_params())["PAD"] = 1;
  (*b.mutable_params())["WPT"] = 4;
  (*b.mutable_params())["TILE"] = 16;
  EXPECT_EQ(HashCandidate(a), HashCandidate(b));
}

TEST(HashCandidateTest, SensitiveToParamsPlanAndSource) {
  const std::string base = HashCandidate(SampleCandidate());

  v1::Candidate c = SampleCandidate();
  (*c.mutable_params())["TILE"] = 32;
  EXPECT_NE(HashCandidate(c), base) << "param value";

  c = SampleCandidate();
  (*c.mutable_params())["EXTRA"] = 0;
  EXPECT_NE(HashCandidate(c), base) << "added param";

  c = SampleCandidate();
  c.mutable_params()->erase("PAD");
  EXPECT_NE(HashCandidate(c), base) << "removed param";

  c = SampleCandidate();
  c.mutable_plan()->mutable_launches(0)->set_local(0, "TILE / 2");
  EXPECT_NE(HashCandidate(c), base) << "launch dimension";

  c = SampleCandidate();
  c.mutable_plan()->mutable_launches(0)->add_args("N");
  EXPECT_NE(HashCandidate(c), base) << "launch argument";

  c = SampleCandidate();
  c.mutable_plan()->mutable_scratch(0)->set_dtype(v1::DTYPE_F64);
  EXPECT_NE(HashCandidate(c), base) << "scratch dtype";

  c = SampleCandidate();
  c.set_source("kernel void k(global float* x) { x[0] = 2.0f; }");
  EXPECT_NE(HashCandidate(c), base) << "source";

  c = SampleCandidate();
  c.set_source("kernel void k(global float* x) { x[0] = 1.0f; /* */ x[1] = 0.0f; }");
  EXPECT_NE(HashCandidate(c), base) << "source statement";

  // The same bytes moved between source and params must not collide.
  v1::Candidate p = SampleCandidate();
  p.clear_params();
  v1::Candidate q = SampleCandidate();
  q.clear_params();
  (*q.mutable_params())["A"] = 1;
  p.set_source(q.source() + " A=1");
  EXPECT_NE(HashCandidate(p), HashCandidate(q));
}

TEST(HashCandidateTest, UnusedDefineIsTheSameCandidate) {
  v1::Candidate a = SampleCandidate();
  v1::Candidate b = SampleCandidate();
  b.set_source("#define UNROLL_HINT 4  // try this\n" + a.source());
  EXPECT_EQ(HashCandidate(a), HashCandidate(b));
  b.set_source("#define ONE 1.0f\n" + std::string("kernel void k(global float* x) {\n  x[0] = ONE;\n}\n"));
  EXPECT_NE(HashCandidate(a), HashCandidate(b));
  b.set_source("#define DEBUG\n#ifdef DEBUG\n#endif\n" + a.source());
  EXPECT_NE(HashCandidate(a), HashCandidate(b));
}

// ---------------------------------------------------------------------------------------------

v1::Problem SampleProblem() {
  v1::Problem p;
  p.set_name("matmul");
  p.set_backend(v1::BACKEND_OPENCL);
  p.set_description("C = A * B");
  v1::SizeSet* s = p.add_size_sets();
  s->set_name("default");
  s->set_bench(true);
  (*s->mutable_sizes())["M"] = 256;
  (*s->mutable_sizes())["N"] = 128;
  (*s->mutable_sizes())["K"] = 64;
  v1::Buffer* b = p.add_buffers();
  b->set_name("A");
  b->set_dtype(v1::DTYPE_F32);
  b->add_shape("M");
  b->add_shape("K");
  b->set_role(v1::BUFFER_ROLE_IN);
  p.mutable_seed()->set_source("kernel void matmul() {}");
  v1::Param* prm = p.mutable_seed()->add_params();
  prm->set_name("TILE");
  prm->add_values(8);
  prm->add_values(16);
  p.mutable_check()->set_atol(1e-3);
  return p;
}

TEST(HashProblemTest, StableAndHex) {
  const std::string h = HashProblem(SampleProblem());
  EXPECT_EQ(h.size(), 64u);
  EXPECT_EQ(h.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(h, HashProblem(SampleProblem()));
}

TEST(HashProblemTest, IndependentOfMapInsertionOrder) {
  v1::Problem a = SampleProblem();
  v1::Problem b = SampleProblem();
  auto* sizes = b.mutable_size_sets(0)->mutable_sizes();
  sizes->clear();
  (*sizes)["K"] = 64;
  (*sizes)["N"] = 128;
  (*sizes)["M"] = 256;
  EXPECT_EQ(HashProblem(a), HashProblem(b));
}

TEST(HashProblemTest, IgnoresContentHashAndLocalCachePath) {
  const std::string base = HashProblem(SampleProblem());
  v1::Problem p = SampleProblem();
  p.set_content_hash(base);
  EXPECT_EQ(HashProblem(p), base);

  v1::Problem r = SampleProblem();
  r.mutable_replay()->set_cache_file("cache.json");
  r.mutable_replay()->set_cache_path("/home/a/cache.json");
  v1::Problem r2 = r;
  r2.mutable_replay()->set_cache_path("/srv/other/cache.json");
  EXPECT_EQ(HashProblem(r), HashProblem(r2));
  // The relative name is part of the problem.
  r2.mutable_replay()->set_cache_file("other.json");
  EXPECT_NE(HashProblem(r), HashProblem(r2));
}

TEST(HashProblemTest, Sensitive) {
  const std::string base = HashProblem(SampleProblem());
  v1::Problem p = SampleProblem();
  (*p.mutable_size_sets(0)->mutable_sizes())["M"] = 257;
  EXPECT_NE(HashProblem(p), base) << "size";

  p = SampleProblem();
  p.set_name("matmul2");
  EXPECT_NE(HashProblem(p), base) << "name";

  p = SampleProblem();
  p.mutable_buffers(0)->set_dtype(v1::DTYPE_F64);
  EXPECT_NE(HashProblem(p), base) << "dtype";

  p = SampleProblem();
  p.mutable_seed()->set_source("kernel void matmul() { }");
  EXPECT_NE(HashProblem(p), base) << "seed source";

  p = SampleProblem();
  p.mutable_seed()->mutable_params(0)->add_values(32);
  EXPECT_NE(HashProblem(p), base) << "param values";

  p = SampleProblem();
  p.mutable_check()->set_atol(1e-4);
  EXPECT_NE(HashProblem(p), base) << "tolerance";

  p = SampleProblem();
  p.set_description("C = A x B");
  EXPECT_NE(HashProblem(p), base) << "description";
}

}  // namespace
}  // namespace kforge
