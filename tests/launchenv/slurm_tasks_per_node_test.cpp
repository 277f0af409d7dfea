#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "launchenv/slurm_tasks_per_node.hpp"

using lspawn::EnvSyntaxError;
using lspawn::slurm::expand_tasks_per_node;
using V = std::vector<int>;

TEST_CASE("expand_tasks_per_node: the forms Slurm writes", "[slurm][tasks]") {
  struct Row {
    const char* text;
    V counts;
  };
  const std::vector<Row> rows = {
      {"1", {1}},
      {"2(x2)", {2, 2}},  // sbatch -N2 --ntasks-per-node=2
      {"1(x2)", {1, 1}},  // srun --ntasks-per-node=1 inside it (the step's value)
      {"3,1", {3, 1}},    // -N2 -n4 on 4-CPU nodes packs 3+1
      {"2(x3),1", {2, 2, 2, 1}},
      {"4,2(x2),1(x3)", {4, 2, 2, 1, 1, 1}},
      {"0,1", {0, 1}},
  };
  for (const Row& r : rows) {
    INFO(r.text);
    CHECK(expand_tasks_per_node(r.text, "SLURM_TASKS_PER_NODE") == r.counts);
  }
}

TEST_CASE("expand_tasks_per_node: errors name the variable and the place", "[slurm][tasks]") {
  struct Row {
    const char* text;
    const char* message;
  };
  const std::vector<Row> rows = {
      {"", "SLURM_TASKS_PER_NODE='': empty"},
      {"2(x3", "SLURM_TASKS_PER_NODE='2(x3': expected ')' at offset 4"},
      {"2(3)", "expected '(x' at offset 1"},
      {"2(x)", "expected a repeat count at offset 3"},
      {"2(x0)", "repeat count 0 at offset 3"},
      {"2,", "expected a count at offset 2"},
      {",2", "expected a count at offset 0"},
      {"2x", "unexpected 'x' at offset 1"},
      {"-1", "expected a count at offset 0"},
      {"1234567890", "more than 9 digits"},
      {"2000000", "above 1000000"},
      {"1(x999999999)", "describes more than 1048576 nodes"},
      {"1(x600000),1(x600000)", "describes more than 1048576 nodes"},
  };
  for (const Row& r : rows) {
    INFO(r.text);
    try {
      expand_tasks_per_node(r.text, "SLURM_TASKS_PER_NODE");
      FAIL("accepted");
    } catch (const EnvSyntaxError& e) {
      CHECK_THAT(e.what(), Catch::Contains(r.message));
      CHECK(e.variable() == "SLURM_TASKS_PER_NODE");
    }
  }
}
