#include "launcher/python_preload.hpp"

#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <stdexcept>
#include <utility>

#include "supervisor/install_layout.hpp"

namespace lspawn::preload {
namespace {

bool readable(const std::string& path) { return !path.empty() && ::access(path.c_str(), R_OK) == 0; }

}  // namespace

bool is_python_interpreter(const std::string& path) {
  const auto slash = path.rfind('/');
  return path.compare(slash == std::string::npos ? 0 : slash + 1, 6, "python") == 0;
}

std::string check_module(const std::string& name) {
  if (name.empty()) return "an empty module name";
  bool start = true;
  for (char c : name) {
    const bool ok = c == '_' || std::isalpha(static_cast<unsigned char>(c)) ||
                    (!start && std::isdigit(static_cast<unsigned char>(c))) || (!start && c == '.');
    if (!ok) return "'" + name + "' is not a Python module name";
    start = c == '.';
  }
  if (start) return "'" + name + "' is not a Python module name";
  return "";
}

std::string check_program(const std::vector<std::string>& program) {
  if (program.empty()) return "missing program";
  if (!is_python_interpreter(program[0])) {
    return "'" + program[0] + "' is not a Python interpreter (python3 SCRIPT [ARGS...] or python3 -m MODULE [ARGS...])";
  }
  if (program.size() < 2) return "'" + program[0] + "' needs a script or -m MODULE";
  const std::string& first = program[1];
  if (first == "-m") {
    if (program.size() < 3) return "-m needs a module name";
    if (auto why = check_module(program[2]); !why.empty()) return "-m " + program[2] + ": " + why;
    return "";
  }
  if (first.size() > 1 && first[0] == '-') {
    return "the interpreter option '" + first + "' is not supported (one interpreter serves every worker: " +
           "set it through the environment, e.g. PYTHONUNBUFFERED=1, or use exec mode)";
  }
  if (first == "-") return "a script from stdin is not supported";
  return "";
}

Files locate() {
  // Beside the binary (supervisor/install_layout.hpp): $LSPAWN_HOME, the install tree, a wheel's
  // package, the build tree. The error names each file it looked for, and where.
  Files files;
  std::string missing;
  for (auto [helper, out] : {std::pair{layout::Helper::PreloadBootstrap, &files.bootstrap},
                             std::pair{layout::Helper::PreloadLibrary, &files.library}}) {
    std::string looked;
    *out = layout::find(helper, &looked);
    if (!readable(*out)) {
      missing += std::string(missing.empty() ? "" : "; ") + layout::file_name(helper) + " (looked for " +
                 (looked.empty() ? std::string("nothing: the program's folder is unknown") : looked) + ")";
    }
  }
  if (!missing.empty()) {
    throw std::runtime_error("lspawn's Python preload server is missing: " + missing +
                             " (a damaged install? reinstall lspawn, or build the lspawn_preload target)");
  }
  return files;
}

std::vector<std::string> server_argv(const std::vector<std::string>& program, const std::vector<std::string>& modules,
                                     const Files& files) {
  std::string joined;
  for (const auto& m : modules) joined += (joined.empty() ? "" : ",") + m;
  return {program.at(0), files.bootstrap, "--lib", files.library, "--modules", joined};
}

std::string worker_argv(const std::vector<std::string>& program) {
  // JSON, by hand: bytes >= 0x80 pass as they are (an argument need not be UTF-8; Python decodes
  // the variable with surrogateescape, as it decodes argv, so sys.argv gets what exec mode gives).
  std::string out = "[";
  for (size_t i = 1; i < program.size(); ++i) {
    out += i > 1 ? ",\"" : "\"";
    for (unsigned char c : program[i]) {
      if (c == '"' || c == '\\') {
        out += '\\';
        out += static_cast<char>(c);
      } else if (c < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", c);
        out += buf;
      } else {
        out += static_cast<char>(c);
      }
    }
    out += '"';
  }
  return out + "]";
}

}  // namespace lspawn::preload
