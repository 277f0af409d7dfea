// The env contract a test gives the workers it starts itself (without lspawn): what torchrun's
// RANK / WORLD_SIZE / MASTER_* are for rank r of a single-node job. Tests only.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace lspawn::test {

// The env contract of rank `rank` of a single-node job of `n` ranks on 127.0.0.1:port
// (LOCAL_RANK = RANK), TORCHELASTIC_RUN_ID `run_id`, OMP_NUM_THREADS=1.
std::map<std::string, std::string> contract_env(int rank, int n, uint16_t port, const std::string& run_id = "test");

}  // namespace lspawn::test
