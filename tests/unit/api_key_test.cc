// API key minting (token format, what is kept of it) and tenant name checks.

#include "common/store/api_key.h"

#include <regex>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/hash.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kforge {
namespace {

using ::testing::HasSubstr;

bool IsLowerHex(const std::string& s) {
  return s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

TEST(MintApiKeyTest, TokenIsKfTwelveHexThenSixtyFourHex) {
  auto k = MintApiKey("acme", "ci", false);
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_TRUE(std::regex_match(k->token, std::regex("kf_[0-9a-f]{12}_[0-9a-f]{64}"))) << k->token;
  ASSERT_EQ(k->token.size(), 3u + 12u + 1u + 64u);
  EXPECT_TRUE(IsLowerHex(k->token.substr(3, 12)));
  EXPECT_TRUE(IsLowerHex(k->token.substr(16)));
}

TEST(MintApiKeyTest, TheIdIsTheTokensPublicPrefix) {
  auto k = MintApiKey("acme", "ci", false);
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_TRUE(std::regex_match(k->record.id(), std::regex("kf_[0-9a-f]{12}"))) << k->record.id();
  EXPECT_EQ(k->token.substr(0, k->record.id().size() + 1), k->record.id() + "_");
  // The id gives nothing of the secret away.
  EXPECT_EQ(k->record.id().find(k->token.substr(16)), std::string::npos);
}

TEST(MintApiKeyTest, TheRecordKeepsTheTokensSha256AndNeverTheToken) {
  auto k = MintApiKey("acme", "ci", false);
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(k->record.secret_sha256(), ApiKeyHash(k->token));
  EXPECT_EQ(k->record.secret_sha256(), Sha256Hex(k->token));
  EXPECT_EQ(k->record.secret_sha256().size(), 64u);
  EXPECT_TRUE(IsLowerHex(k->record.secret_sha256()));
  const std::string secret = k->token.substr(16);
  const std::string bytes = k->record.SerializeAsString();
  EXPECT_EQ(bytes.find(secret), std::string::npos);
  EXPECT_EQ(bytes.find(k->token), std::string::npos);
}

TEST(MintApiKeyTest, ApiKeyHashIsSha256Hex) {
  // FIPS 180-2 test vectors.
  EXPECT_EQ(ApiKeyHash("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(ApiKeyHash(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_NE(ApiKeyHash("kf_a"), ApiKeyHash("kf_b"));
}

TEST(MintApiKeyTest, TheRecordNamesTenantNameAndKind) {
  auto user = MintApiKey("acme", "alice's laptop", false);
  ASSERT_TRUE(user.ok()) << user.status();
  EXPECT_EQ(user->record.tenant(), "acme");
  EXPECT_EQ(user->record.name(), "alice's laptop");
  EXPECT_FALSE(user->record.service());
  EXPECT_FALSE(user->record.revoked());
  EXPECT_FALSE(user->record.has_created_at());  // the caller's clock sets it
  auto svc = MintApiKey("acme", "worker", true);
  ASSERT_TRUE(svc.ok()) << svc.status();
  EXPECT_TRUE(svc->record.service());
}

TEST(MintApiKeyTest, TwoMintsDiffer) {
  auto a = MintApiKey("acme", "ci", false);
  auto b = MintApiKey("acme", "ci", false);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->token, b->token);
  EXPECT_NE(a->record.id(), b->record.id());
  EXPECT_NE(a->record.secret_sha256(), b->record.secret_sha256());
  EXPECT_NE(a->token.substr(16), b->token.substr(16));  // the secrets, not just the ids

  std::set<std::string> ids, secrets;
  for (int i = 0; i < 1000; ++i) {
    auto k = MintApiKey("acme", "ci", false);
    ASSERT_TRUE(k.ok()) << k.status();
    ids.insert(k->record.id());
    secrets.insert(k->token.substr(16));
  }
  EXPECT_EQ(ids.size(), 1000u);
  EXPECT_EQ(secrets.size(), 1000u);
}

TEST(CheckTenantNameTest, AcceptsLowercaseDigitsAndInnerDashes) {
  for (const std::string& name : std::vector<std::string>{"a", "acme", "team-1", "0", "42team", "a-b-c", "a-", std::string(64, 'x')}) {
    EXPECT_TRUE(CheckTenantName(name).ok()) << "'" << name << "': " << CheckTenantName(name);
  }
}

TEST(CheckTenantNameTest, RefusesEmptyAndTooLongNames) {
  EXPECT_EQ(CheckTenantName("").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckTenantName(std::string(65, 'x')).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckTenantName(std::string(1000, 'x')).code(), absl::StatusCode::kInvalidArgument);
}

TEST(CheckTenantNameTest, RefusesBadBytes) {
  for (const std::string& name : std::vector<std::string>{"-acme", "Acme", "ac_me", "ac me", "a.b", "a/b", "acm\xc3\xa9", "tab\t",
                                 std::string("a\0b", 3), "a\n"}) {
    const absl::Status st = CheckTenantName(name);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << "'" << name << "' was accepted";
  }
}

TEST(CheckTenantNameTest, TheErrorNamesTheFirstBadByte) {
  absl::Status st = CheckTenantName("ac_m E");
  ASSERT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("byte 2"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("0x5f"));
  EXPECT_THAT(std::string(st.message()), ::testing::Not(HasSubstr("0x20")));

  st = CheckTenantName("-acme");
  ASSERT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("byte 0"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("0x2d"));

  st = CheckTenantName(std::string("ab\0", 3));
  ASSERT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("byte 2"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("0x00"));
}

}  // namespace
}  // namespace kforge
