#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "launchenv/slurm_hostlist.hpp"

using lspawn::EnvSyntaxError;
using lspawn::slurm::expand_hostlist;
using lspawn::slurm::first_host;
using V = std::vector<std::string>;

// Each row was checked against `scontrol show hostnames` of Slurm 22.05.8 (Debian bookworm),
// except where the comment says lspawn differs on purpose.
TEST_CASE("expand_hostlist: the forms Slurm writes", "[slurm][hostlist]") {
  struct Row {
    const char* text;
    V hosts;
  };
  const std::vector<Row> rows = {
      {"n1", {"n1"}},
      {"n[1-2]", {"n1", "n2"}},             // SLURM_JOB_NODELIST, -N2
      {"lsp-a,lsp-b", {"lsp-a", "lsp-b"}},  // names without numbers
      {"n[01-04,07],gpu-a[1-2]", {"n01", "n02", "n03", "n04", "n07", "gpu-a1", "gpu-a2"}},
      {"n[08-10]", {"n08", "n09", "n10"}},  // zero padding kept
      {"n[8-10]", {"n8", "n9", "n10"}},
      {"n[001-003]", {"n001", "n002", "n003"}},
      {"n[1-010]", {"n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8", "n9", "n10"}},  // lo's width
      {"n[01-2]", {"n01", "n02"}},
      {"r[1-2]n[1-2]", {"r1n1", "r1n2", "r2n1", "r2n2"}},  // several groups: product
      {"n[1-2][3-4]", {"n13", "n14", "n23", "n24"}},
      {"a[1-2],a1", {"a1", "a2", "a1"}},  // order and duplicates kept
      {"a,,b", {"a", "b"}},               // empty items skipped
      {",a", {"a"}},
      {"a,", {"a"}},
      {"a b", {"a", "b"}},  // whitespace separates too
      {"a, b", {"a", "b"}},
      {"[1-2]", {"1", "2"}},
      {"n[1-2]-ib", {"n1-ib", "n2-ib"}},  // lspawn extension: 22.05 refuses text after a group
      {"node[7]", {"node7"}},
  };
  for (const Row& r : rows) {
    INFO(r.text);
    CHECK(expand_hostlist(r.text, "SLURM_JOB_NODELIST") == r.hosts);
    CHECK(first_host(r.text, "SLURM_JOB_NODELIST") == r.hosts.front());
  }
}

TEST_CASE("expand_hostlist: errors name the variable, the value and the place", "[slurm][hostlist]") {
  struct Row {
    const char* text;
    const char* message;
  };
  const std::vector<Row> rows = {
      {"", "SLURM_JOB_NODELIST='': empty hostlist"},
      {",", "SLURM_JOB_NODELIST=',': no host names"},
      {"n[1-2", "SLURM_JOB_NODELIST='n[1-2': '[' at offset 1 is never closed"},  // Slurm: "n]"
      {"n[", "SLURM_JOB_NODELIST='n[': '[' at offset 1 is never closed"},
      {"n]", "SLURM_JOB_NODELIST='n]': ']' at offset 1 without a matching '['"},
      {"n[2-1]", "SLURM_JOB_NODELIST='n[2-1]': range 2-1 at offset 1 goes down"},
      {"n[]", "SLURM_JOB_NODELIST='n[]': expected a number at offset 2"},
      {"n[1,,2]", "SLURM_JOB_NODELIST='n[1,,2]': expected a number at offset 4"},
      {"n[-2]", "SLURM_JOB_NODELIST='n[-2]': expected a number at offset 2"},
      {"n[ 1-2]", "SLURM_JOB_NODELIST='n[ 1-2]': expected a number at offset 2"},
      {"n[1[2]]", "SLURM_JOB_NODELIST='n[1[2]]': '[' at offset 3 inside another '['"},
      {"bgl[123x456]", "SLURM_JOB_NODELIST='bgl[123x456]': 'x' at offset 7: multi-dimensional"},
      {"n[1a]", "SLURM_JOB_NODELIST='n[1a]': unexpected 'a' at offset 3"},
      {"n[1234567890123456789]", "more than 18 digits"},
      {"n[0-99999999999]", "expands to more than 1048576 hosts"},
      {"a[0-999]b[0-9999]", "expands to more than 1048576 hosts"},
      {"a\x01", "control character at offset 1"},
  };
  for (const Row& r : rows) {
    INFO(r.text);
    try {
      expand_hostlist(r.text, "SLURM_JOB_NODELIST");
      FAIL("accepted");
    } catch (const EnvSyntaxError& e) {
      CHECK_THAT(e.what(), Catch::Contains(r.message));
      CHECK(e.variable() == "SLURM_JOB_NODELIST");
    }
    CHECK_THROWS_AS(first_host(r.text, "SLURM_JOB_NODELIST"), EnvSyntaxError);
  }
}

TEST_CASE("expand_hostlist: the limit counts every host of every item", "[slurm][hostlist]") {
  CHECK(expand_hostlist("n[1-3],m[1-2]", "V", 5).size() == 5);
  CHECK_THROWS_WITH(expand_hostlist("n[1-3],m[1-3]", "V", 5), Catch::Contains("more than 5 hosts"));
  // first_host of a huge but legal list does not expand it
  CHECK(first_host("n[000000-999999]", "V") == "n000000");
}
