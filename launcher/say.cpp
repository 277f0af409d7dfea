#include "launcher/say.hpp"

#include "sys/sys.hpp"

namespace lspawn::cli {

void say(const std::string& line) { write_stderr("lspawn: " + line + "\n"); }

void write_stderr(const std::string& text) {
  try {
    sys::write_all(2, text, "stderr");
  } catch (const sys::SysError&) {}
}

std::string workers_text(int n) { return std::to_string(n) + " worker" + (n == 1 ? "" : "s"); }

}  // namespace lspawn::cli
