// The coordinator's config keys for its jobs: defaults, values read from a file, and a bad value
// named with its key.

#include "services/coordinator/coordinator_config.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testutil/temp_dir.h"

namespace kforge::coordinator {
namespace {

using ::testing::HasSubstr;

TEST(CoordinatorConfigTest, ReadyCandidatesDefaultToTheSlotsAndCanBeTurnedOff) {
  testing::TempDir dir;
  {
    CoordinatorOptions o;
    ConfigSchema schema;
    AddCoordinatorFields(schema, o);
    ASSERT_TRUE(schema.LoadFile(dir.Write("a.yaml", "jobs: {slots: 6}\n")).ok());
    EXPECT_EQ(o.slots_per_job, 6);
    EXPECT_EQ(o.ready_per_job, -1) << "-1: as many as jobs.slots";
  }
  {
    CoordinatorOptions o;
    ConfigSchema schema;
    AddCoordinatorFields(schema, o);
    ASSERT_TRUE(schema.LoadFile(dir.Write("b.yaml", "jobs: {slots: 6, ready: 0}\n")).ok());
    EXPECT_EQ(o.ready_per_job, 0);
  }
  {
    CoordinatorOptions o;
    ConfigSchema schema;
    AddCoordinatorFields(schema, o);
    absl::Status st = schema.LoadFile(dir.Write("c.yaml", "jobs: {ready: -2}\n"));
    ASSERT_FALSE(st.ok());
    EXPECT_THAT(std::string(st.message()), HasSubstr("jobs.ready: must be >= -1"));
  }
}

}  // namespace
}  // namespace kforge::coordinator
