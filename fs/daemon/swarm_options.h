// The fleet's options (--swarm-*, cache/backend/swarm_reader.h): their rows of the option table
// and the check that they come together.
#pragma once

#include <vector>

#include "fs/daemon/config.h"

namespace accelfs {

std::vector<OptionSpec> SwarmOptionSpecs();
// The swarm's options need --swarm-listen, which needs --swarm-dir; --swarm-ca, --swarm-cert
// and --swarm-key come together.
Status FinishSwarm(const Config& config);

}  // namespace accelfs
