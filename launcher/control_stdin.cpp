#include "launcher/control_stdin.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include "launcher/say.hpp"
#include "sys/exit_codes.hpp"
#include "supervisor/job_secret.hpp"
#include "sys/sys.hpp"

namespace lspawn::cli {
namespace {

// One line of `fd` (without its '\n'), waiting at most until `end`; nullopt at its end, on an
// error, or at `end`.
std::optional<std::string> read_line(int fd, std::chrono::steady_clock::time_point end) {
  std::string line;
  for (;;) {
    int wait_ms = -1;  // end == time_point::max(): no bound
    if (end != std::chrono::steady_clock::time_point::max()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      wait_ms = static_cast<int>(std::min<int64_t>(left.count(), 1 << 30));
    }
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, wait_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return std::nullopt;
    char c;
    const ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::nullopt;
    if (c == '\n') return line;
    if (line.size() > 4096) return std::nullopt;
    line += c;
  }
}

// The reader of the channel after the secret: raises each signal it names; SIGHUP at its end.
void read_signals(int fd) {
  sigset_t all;
  sigfillset(&all);
  ::pthread_sigmask(SIG_BLOCK, &all, nullptr);  // raised signals go to lspawn's own handling
  const auto never = std::chrono::steady_clock::time_point::max();
  while (auto line = read_line(fd, never)) {
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) {
      if (*line == sys::signal_name(sig)) ::kill(::getpid(), sig);
    }
  }
  ::kill(::getpid(), SIGHUP);
}

}  // namespace

std::optional<int> take_control_stdin(std::chrono::milliseconds timeout) {
  const auto secret = read_line(0, std::chrono::steady_clock::now() + timeout);
  if (!secret) {
    say("--control-stdin: no job secret on stdin within " + std::to_string(timeout.count() / 1000) +
        " s (this flag is set by lspawn --hostfile/--hosts on the lspawn it starts on each host)");
    return exit_codes::kUsage;
  }
  ::setenv("LSPAWN_JOB_SECRET", secret->c_str(), 1);
  try {
    (void)job_secret_from_environment();  // checks it, without showing it
  } catch (const std::exception& e) {
    say(std::string("--control-stdin: the job secret on stdin is not one: ") + e.what());
    return exit_codes::kUsage;
  }
  const int channel = ::fcntl(0, F_DUPFD_CLOEXEC, 3);
  const int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (channel < 0 || null < 0) {
    say(std::string("--control-stdin: cannot take stdin over: ") + std::strerror(errno));
    return exit_codes::kInternal;
  }
  ::dup2(null, 0);  // the workers' stdin
  ::close(null);
  std::thread(read_signals, channel).detach();
  return std::nullopt;
}

}  // namespace lspawn::cli
