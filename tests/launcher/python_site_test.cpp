// launcher/python_site.hpp: which workers get lspawn's sitecustomize (the Python hang diagnosis in
// exec mode), and what it does to their environment.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "launcher/python_site.hpp"

using lspawn::python_site::decide;
using lspawn::python_site::Decision;

namespace {
std::vector<std::string> argv(std::initializer_list<const char*> a) { return {a.begin(), a.end()}; }
}  // namespace

TEST_CASE("python_site: a Python interpreter gets the site folder, other programs are left alone", "[launcher]") {
  const Decision py = decide(argv({"/usr/bin/python3", "-u", "train.py"}), {});
  CHECK(py.python);
  CHECK(py.off_why.empty());
  REQUIRE_FALSE(py.site_dir.empty());  // the build tree's python/lspawn_site, beside this test's lspawn
  CHECK(py.site_dir.size() > 12);
  CHECK(py.site_dir.compare(py.site_dir.size() - 12, 12, "/lspawn_site") == 0);
  CHECK(decide(argv({"python3.11", "-m", "pkg"}), {}).python);
  const Decision other = decide(argv({"/bin/sh", "-c", "python3 x.py"}), {});
  CHECK_FALSE(other.python);
  CHECK(other.site_dir.empty());
  CHECK(other.off_why.empty());
}

TEST_CASE(
    "python_site: off with LSPAWN_PYTHON_SITE=0, -E, -I or -S, each named - values after -c, -m, -W, -X are not "
    "options",
    "[launcher]") {
  CHECK(decide(argv({"python3", "x.py"}), {"LSPAWN_PYTHON_SITE=0"}).off_why == "LSPAWN_PYTHON_SITE=0 is set");
  CHECK(decide(argv({"python3", "-E", "x.py"}), {}).off_why == "the interpreter runs with -E (PYTHONPATH ignored)");
  CHECK(decide(argv({"python3", "-uI", "x.py"}), {}).off_why == "the interpreter runs with -I (PYTHONPATH ignored)");
  CHECK(decide(argv({"python3", "-S", "x.py"}), {}).off_why == "the interpreter runs with -S (no site module)");
  for (const auto& on : {argv({"python3", "x.py", "-E"}),            // the script's own argument
                         argv({"python3", "-c", "print(1)", "-S"}),  // the command's
                         argv({"python3", "-m", "mod", "-I"}),       // the module's
                         argv({"python3", "-W", "E", "x.py"}),       // -W's value
                         argv({"python3", "-X", "S", "x.py"}),       // -X's value
                         argv({"python3", "-WE", "x.py"})}) {        // -W's value, joined
    INFO(on[1] << " " << on[2]);
    const Decision d = decide(on, {});
    CHECK(d.off_why.empty());
    CHECK_FALSE(d.site_dir.empty());
  }
}

TEST_CASE("python_site: apply puts the folder first on PYTHONPATH and sets the flag - off, it changes nothing",
          "[launcher]") {
  Decision d;
  d.python = true;
  d.site_dir = "/opt/lspawn/python/lspawn_site";
  std::vector<std::string> env{"HOME=/root", "PYTHONPATH=/u/lib:/v", "LSPAWN_PYTHON_SITE=1"};
  lspawn::python_site::apply(d, env);
  const std::vector<std::string> want_env{"HOME=/root", "PYTHONPATH=/opt/lspawn/python/lspawn_site:/u/lib:/v",
                                          "LSPAWN_PYTHON_SITE=1"};
  CHECK(env == want_env);
  std::vector<std::string> bare{"HOME=/root"};
  lspawn::python_site::apply(d, bare);
  const std::vector<std::string> want_bare{"HOME=/root", "PYTHONPATH=/opt/lspawn/python/lspawn_site",
                                           "LSPAWN_PYTHON_SITE=1"};
  CHECK(bare == want_bare);
  Decision off;
  off.python = true;
  off.off_why = "LSPAWN_PYTHON_SITE=0 is set";
  std::vector<std::string> kept{"PYTHONPATH=/u", "LSPAWN_PYTHON_SITE=0"};
  lspawn::python_site::apply(off, kept);
  const std::vector<std::string> want_kept{"PYTHONPATH=/u", "LSPAWN_PYTHON_SITE=0"};
  CHECK(kept == want_kept);
}
