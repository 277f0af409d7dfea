#include "spawn/errors.hpp"

#include "sys/sys.hpp"

namespace lspawn {
namespace {
std::string raised_message(int index, const std::string& type, const std::string& what, const std::string& backtrace) {
  std::string m = "process " + std::to_string(index) + " terminated with the following error:\n" + type + ": " + what;
  if (!backtrace.empty()) m += "\n" + backtrace;
  return m;
}
std::string exited_message(int index, int exit_code, int signal) {
  return "process " + std::to_string(index) + " terminated with " +
         (signal != 0 ? "signal " + sys::signal_name(signal) : "exit code " + std::to_string(exit_code));
}
}  // namespace

ProcessRaisedException::ProcessRaisedException(int index, pid_t pid, std::string type, std::string what_text,
                                               std::string backtrace)
    : ProcessException(raised_message(index, type, what_text, backtrace), index, pid),
      type_(std::move(type)),
      what_(std::move(what_text)),
      backtrace_(std::move(backtrace)) {}

ProcessExitedException::ProcessExitedException(int index, pid_t pid, int exit_code, int signal)
    : ProcessException(exited_message(index, exit_code, signal), index, pid), exit_code_(exit_code), signal_(signal) {}

std::string ProcessExitedException::signal_name() const {
  return signal_ != 0 ? sys::signal_name(signal_) : std::string();
}

}  // namespace lspawn
