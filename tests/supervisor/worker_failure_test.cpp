// supervisor/worker_failure.hpp: each case runs in a forked child, whose signal dispositions and
// death the test reads from outside.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <string>

#include "supervisor/worker_failure.hpp"

namespace {

struct ChildResult {
  int status = 0;
  std::string said;  // what the child wrote to its pipe
};

// Runs `body` in a forked child that says things through `say`, then _exits 0.
ChildResult in_child(const std::function<void(const std::function<void(const char*)>&)>& body) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    ::signal(SIGTERM, SIG_DFL);
    ::signal(SIGPIPE, SIG_DFL);
    const int w = fds[1];
    body([w](const char* text) { (void)!::write(w, text, std::char_traits<char>::length(text)); });
    ::_exit(0);
  }
  ::close(fds[1]);
  ChildResult r;
  char buf[256];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) r.said.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  REQUIRE(::waitpid(pid, &r.status, 0) == pid);
  return r;
}

bool killed_by(const ChildResult& r, int sig) { return WIFSIGNALED(r.status) && WTERMSIG(r.status) == sig; }

// Raises SIGTERM from a destructor that runs while an exception unwinds.
struct TermWhileUnwinding {
  std::function<void(const char*)> say;
  ~TermWhileUnwinding() {
    say(lspawn::TermHold::held() ? "held before;" : "");
    ::raise(SIGTERM);
    say(lspawn::TermHold::held() ? "held;" : "not held;");
    say("unwound;");
  }
};

int64_t fixed_clock(const std::exception_ptr&) { return 42; }

}  // namespace

TEST_CASE("TermHold: a SIGTERM during an unwinding waits for the catch, then ends the process", "[worker_failure]") {
  const auto r = in_child([](const auto& say) {
    {
      lspawn::TermHold hold;
      say(hold.active() ? "active;" : "inactive;");
      try {
        TermWhileUnwinding t{say};
        throw std::runtime_error("failed");
      } catch (const std::exception&) {
        say("report written;");
      }
    }
    say("after the hold;");  // never: the held SIGTERM acts when the hold ends
  });
  INFO(r.said);
  CHECK(r.said == "active;held;unwound;report written;");
  CHECK(killed_by(r, SIGTERM));
}

TEST_CASE("TermHold: a SIGTERM while the catch writes the report (Reporting) waits for it, then ends the process",
          "[worker_failure]") {
  // Inside a catch no exception is in flight (uncaught_exceptions() == 0): without Reporting this
  // SIGTERM ends the process before "report written;" (what spawn()'s worker and record() guard).
  const auto r = in_child([](const auto& say) {
    {
      lspawn::TermHold hold;
      try {
        throw std::runtime_error("failed");
      } catch (const std::exception&) {
        lspawn::TermHold::Reporting reporting;
        ::raise(SIGTERM);
        say(lspawn::TermHold::held() ? "held;" : "not held;");
        say("report written;");
      }
      say("catch ended;");
    }
    say("after the hold;");  // never: the held SIGTERM acts when the hold ends
  });
  INFO(r.said);
  CHECK(r.said == "held;report written;catch ended;");
  CHECK(killed_by(r, SIGTERM));
}

TEST_CASE("TermHold: a SIGTERM with no exception in flight acts at once", "[worker_failure]") {
  const auto r = in_child([](const auto& say) {
    lspawn::TermHold hold;
    ::raise(SIGTERM);
    say("survived;");
  });
  CHECK(r.said.empty());
  CHECK(killed_by(r, SIGTERM));
}

TEST_CASE("TermHold: nested holds deliver once the outermost ends, and restore SIG_DFL", "[worker_failure]") {
  const auto r = in_child([](const auto& say) {
    {
      lspawn::TermHold outer;
      {
        lspawn::TermHold inner;
        try {
          TermWhileUnwinding t{say};
          throw 1;
        } catch (int) {}
      }
      say("inner ended;");
    }
    say("never;");
  });
  CHECK(r.said == "held;unwound;inner ended;");
  CHECK(killed_by(r, SIGTERM));
  // With nothing held, the disposition the hold found is back.
  const auto clean = in_child([](const auto& say) {
    { lspawn::TermHold hold; }
    struct sigaction now {};
    ::sigaction(SIGTERM, nullptr, &now);
    say(now.sa_handler == SIG_DFL ? "SIG_DFL" : "changed");
  });
  CHECK(clean.said == "SIG_DFL");
}

TEST_CASE("TermHold: a program that handles or ignores SIGTERM itself is left alone", "[worker_failure]") {
  const auto r = in_child([](const auto& say) {
    ::signal(SIGTERM, SIG_IGN);
    lspawn::TermHold hold;
    say(hold.active() ? "active;" : "inactive;");
    ::raise(SIGTERM);  // ignored, as the program asked
    struct sigaction now {};
    ::sigaction(SIGTERM, nullptr, &now);
    say(now.sa_handler == SIG_IGN ? "still ignored;" : "changed;");
  });
  CHECK(r.said == "inactive;still ignored;");
  CHECK(WIFEXITED(r.status));
}

TEST_CASE("ignore_sigpipe_if_default: SIG_DFL becomes SIG_IGN, a program's handler stays", "[worker_failure]") {
  const auto dfl = in_child([](const auto& say) {
    say(lspawn::ignore_sigpipe_if_default() ? "ignored;" : "not ignored;");
    int fds[2];
    if (::pipe(fds) != 0) return;
    ::close(fds[0]);
    const bool epipe = ::write(fds[1], "x", 1) < 0 && errno == EPIPE;
    say(epipe ? "EPIPE;" : "wrote;");
  });
  CHECK(dfl.said == "ignored;EPIPE;");
  CHECK(WIFEXITED(dfl.status));
  static volatile sig_atomic_t calls = 0;
  const auto own = in_child([](const auto& say) {
    ::signal(SIGPIPE, [](int) { calls = calls + 1; });
    say(lspawn::ignore_sigpipe_if_default() ? "ignored;" : "not ignored;");
    ::raise(SIGPIPE);
    say(calls == 1 ? "handler ran;" : "handler did not run;");
  });
  CHECK(own.said == "not ignored;handler ran;");
}

TEST_CASE("throw_time_us: 0 without a clock or an exception, else the clock's reading", "[worker_failure]") {
  const auto r = in_child([](const auto& say) {
    const std::exception_ptr e = std::make_exception_ptr(std::runtime_error("x"));
    say(lspawn::throw_time_us(e) == 0 ? "no clock: 0;" : "no clock: set;");
    lspawn::set_throw_clock(&fixed_clock);
    say(lspawn::throw_time_us(e) == 42 ? "clock: 42;" : "clock: other;");
    say(lspawn::throw_time_us(nullptr) == 0 ? "no exception: 0;" : "no exception: set;");
  });
  CHECK(r.said == "no clock: 0;clock: 42;no exception: 0;");
}
