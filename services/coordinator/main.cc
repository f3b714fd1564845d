// kforge-coordinator: reads its config and wires the coordinator's parts.

#include <iostream>

#include "common/logging.h"
#include "services/coordinator/coordinator_config.h"

int main(int argc, char** argv) {
  kforge::coordinator::CoordinatorOptions opts;
  kforge::ConfigSchema schema;
  kforge::coordinator::AddCoordinatorFields(schema, opts);
  if (auto rc = kforge::LoadServiceConfigFromArgs(argc, argv, "kforge-coordinator",
                                                  "kforge coordinator: jobs, evolution, dispatch",
                                                  "KFORGE_COORDINATOR", schema)) {
    return *rc;
  }
  auto log = kforge::MakeLogger("coordinator", *kforge::ParseLogLevel(opts.server.log_level));
  std::cout << schema.Dump();
  log->warn("serving is not implemented yet in this build; use `kforge run` (embedded mode)");
  return 0;
}
