#include "support/ranks.hpp"

namespace lspawn::test {

std::map<std::string, std::string> contract_env(int rank, int n, uint16_t port, const std::string& run_id) {
  return {{"RANK", std::to_string(rank)},    {"LOCAL_RANK", std::to_string(rank)},
          {"WORLD_SIZE", std::to_string(n)}, {"LOCAL_WORLD_SIZE", std::to_string(n)},
          {"MASTER_ADDR", "127.0.0.1"},      {"MASTER_PORT", std::to_string(port)},
          {"TORCHELASTIC_RUN_ID", run_id},   {"OMP_NUM_THREADS", "1"}};
}

}  // namespace lspawn::test
