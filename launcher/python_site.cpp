#include "launcher/python_site.hpp"

#include <unistd.h>

#include "launcher/python_preload.hpp"
#include "supervisor/install_layout.hpp"

namespace lspawn::python_site {
namespace {

const std::string* find_env(const std::vector<std::string>& env, const std::string& name) {
  for (const auto& e : env)
    if (e.size() > name.size() && e.compare(0, name.size(), name) == 0 && e[name.size()] == '=') return &e;
  return nullptr;
}

// The interpreter option among program[1..] that keeps Python from loading sitecustomize.py from
// PYTHONPATH ("" when none): -E and -I ignore PYTHONPATH, -S skips `site`.
std::string blocking_option(const std::vector<std::string>& program) {
  for (std::size_t i = 1; i < program.size(); ++i) {
    const std::string& a = program[i];
    if (a.size() < 2 || a[0] != '-' || a == "--") return "";  // the script (or "-": stdin)
    if (a[1] == '-') continue;                                // --help-env, --check-hash-based-pycs ...
    for (std::size_t k = 1; k < a.size(); ++k) {
      const char c = a[k];
      if (c == 'E' || c == 'I' || c == 'S') return std::string("-") + c;
      if (c == 'c' || c == 'm') return "";  // the rest is the command or module and its arguments
      if (c == 'W' || c == 'X') {           // takes a value: the rest of this word or the next one
        if (k + 1 == a.size()) ++i;
        break;
      }
    }
  }
  return "";
}

}  // namespace

Decision decide(const std::vector<std::string>& program, const std::vector<std::string>& env) {
  Decision d;
  if (program.empty() || !preload::is_python_interpreter(program[0])) return d;
  d.python = true;
  if (const auto* e = find_env(env, kEnv); e && e->substr(std::string(kEnv).size() + 1) == "0") {
    d.off_why = std::string(kEnv) + "=0 is set";
    return d;
  }
  if (const std::string opt = blocking_option(program); !opt.empty()) {
    d.off_why = "the interpreter runs with " + opt + (opt == "-S" ? " (no site module)" : " (PYTHONPATH ignored)");
    return d;
  }
  std::string looked;
  const std::string file = layout::find(layout::Helper::PythonSite, &looked);
  if (file.empty() || ::access(file.c_str(), R_OK) != 0) {
    d.off_why = "lspawn's sitecustomize.py is missing (looked for " + looked + ")";
    return d;
  }
  d.site_dir = file.substr(0, file.rfind('/'));
  return d;
}

void apply(const Decision& decision, std::vector<std::string>& env) {
  if (decision.site_dir.empty()) return;
  std::string path = decision.site_dir;
  bool set_flag = false;
  for (auto& e : env) {
    if (e.compare(0, 11, "PYTHONPATH=") == 0) {
      const std::string old = e.substr(11);
      e = "PYTHONPATH=" + path + (old.empty() ? "" : ":" + old);
      path.clear();
    } else if (e.compare(0, std::string(kEnv).size() + 1, std::string(kEnv) + "=") == 0) {
      e = std::string(kEnv) + "=1";
      set_flag = true;
    }
  }
  if (!path.empty()) env.push_back("PYTHONPATH=" + path);
  if (!set_flag) env.push_back(std::string(kEnv) + "=1");
}

}  // namespace lspawn::python_site
