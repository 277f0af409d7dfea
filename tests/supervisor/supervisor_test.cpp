// The Supervisor as a library (what lspawn::spawn() builds on): fork-callable and exec workers,
// fail fast, terminate(), repeated run_until(), adopted workers with notify_exit(), watch_fd().
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <thread>

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "supervisor/error_file.hpp"
#include "supervisor/supervisor.hpp"
#include "support/temp_dir.hpp"
#include "sys/shm_segments.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

using namespace lspawn;
using namespace std::chrono_literals;

namespace {
SupervisorOptions opts(CaptureSink* cap, std::chrono::milliseconds grace = 2000ms) {
  SupervisorOptions o;
  o.grace_period = grace;
  if (cap) o.sinks.push_back(cap);
  return o;
}

int wait_forever() {
  for (;;) pause();
}
}  // namespace

TEST_CASE("supervisor: fork workers - output captured - exit codes", "[supervisor]") {
  CaptureSink cap;
  Supervisor sup(opts(&cap));
  for (int r = 0; r < 3; ++r) {
    sup.start_fork(r, ForkSpec{[r] {
                                 std::printf("hello %d\n", r);
                                 std::fprintf(stderr, "err %d", r);
                                 return 0;
                               },
                               "", r});
  }
  sup.run();
  CHECK(sup.finished());
  CHECK(sup.exit_code() == 0);
  CHECK(sup.summary().empty());
  CHECK_FALSE(sup.root_cause());
  for (int r = 0; r < 3; ++r) {
    CHECK(cap.text(r, Stream::Stdout) == "hello " + std::to_string(r) + "\n");
    CHECK(cap.text(r, Stream::Stderr) == "err " + std::to_string(r));
    const auto& res = sup.result(r);
    CHECK(res.exited);
    CHECK(res.state == WorkerState::Done);
    CHECK(res.exit_code == 0);
    CHECK(res.pid > 0);
  }
}

TEST_CASE("supervisor: first failure is the root cause - the others are stopped", "[supervisor]") {
  Supervisor sup(opts(nullptr));
  sup.start_fork(0, ForkSpec{wait_forever, "", 0});
  sup.start_fork(1, ForkSpec{[] { return 3; }, "", 1});
  sup.start_fork(2, ForkSpec{wait_forever, "", 2});
  sup.run();
  REQUIRE(sup.root_cause());
  CHECK(*sup.root_cause() == 1);
  CHECK(sup.exit_code() == 3);
  CHECK(sup.result(1).root_cause);
  CHECK(sup.result(1).describe() == "process 1 terminated with exit code 3");
  CHECK(sup.result(0).killed_by_supervisor());
  CHECK(sup.result(0).term_signal == SIGTERM);
  CHECK(sup.result(2).killed_by_supervisor());
  const std::string s = sup.summary();
  CHECK(s.find("lspawn: root cause: process 1 terminated with exit code 3") == 0);
  CHECK(s.find("process 0 (pid " + std::to_string(sup.result(0).pid) + ") terminated by lspawn with SIGTERM") !=
        std::string::npos);
}

TEST_CASE("supervisor: an uncaught exception in a fork worker writes an ErrorReport", "[supervisor]") {
  const lspawn::test::TempDir dir;
  Supervisor sup(opts(nullptr));
  sup.start_fork(0, ForkSpec{[]() -> int { throw std::invalid_argument("bad shape [2, 3]"); }, dir.file("e0.json"), 0});
  sup.run();
  const auto& r = sup.result(0);
  CHECK(r.exit_code == 1);
  REQUIRE(r.report);
  CHECK(r.report->exception_type == "std::invalid_argument");
  CHECK(r.report->message == "bad shape [2, 3]");
  CHECK(r.report->rank == 0);
  CHECK(r.report->pid == r.pid);
  CHECK(sup.summary().find("error: std::invalid_argument: bad shape [2, 3]") != std::string::npos);
}

TEST_CASE("supervisor: terminate() and run_until() called repeatedly (join(timeout))", "[supervisor]") {
  Supervisor sup(opts(nullptr, 200ms));
  sup.start_fork(0, ForkSpec{wait_forever, "", 0});
  sup.start_fork(1, ForkSpec{[] {
                               signal(SIGTERM, SIG_IGN);
                               return wait_forever();
                             },
                             "", 1});
  CHECK_FALSE(sup.run_until(Clock::now() + 50ms));
  CHECK_FALSE(sup.run_until(Clock::now() + 20ms));
  CHECK(sup.phase() == Phase::Running);
  sup.terminate();
  CHECK(sup.phase() == Phase::Stopping);
  CHECK(sup.run_until(Clock::now() + 5s));
  CHECK(sup.stop_signal() == SIGTERM);
  CHECK(sup.exit_code() == 128 + SIGTERM);
  CHECK_FALSE(sup.root_cause());
  CHECK(sup.result(0).term_signal == SIGTERM);
  CHECK(sup.result(1).term_signal == SIGKILL);  // ignored TERM: killed after the grace period
  CHECK(sup.result(1).killed_by_supervisor());
  CHECK(sup.run_until(Clock::now() + 1s));  // harmless once finished
}

TEST_CASE("supervisor: exec failure reported through the close-on-exec pipe", "[supervisor]") {
  Supervisor sup(opts(nullptr));
  ExecSpec spec;
  spec.path = "/nonexistent/lspawn-prog";
  spec.argv = {spec.path};
  sup.start_exec(0, spec);
  CHECK(sup.result(0).exec_error == "cannot execute '/nonexistent/lspawn-prog': No such file or directory");
  sup.run();
  CHECK(sup.exit_code() == 127);
  CHECK(sup.summary().find("cannot execute '/nonexistent/lspawn-prog'") != std::string::npos);

  Supervisor sup2(opts(nullptr));
  spec.path = "/etc/hostname";  // exists, not executable
  spec.argv = {spec.path};
  sup2.start_exec(0, spec);
  sup2.run();
  CHECK(sup2.exit_code() == 126);
}

TEST_CASE("supervisor: exec workers get argv - env and a clean signal mask", "[supervisor]") {
  CaptureSink cap;
  Supervisor sup(opts(&cap));
  ExecSpec spec;
  spec.path = "/bin/sh";
  spec.argv = {"sh", "-c", "echo $FOO $0; grep SigBlk /proc/self/status", "arg0"};
  spec.env = {"FOO=bar", "PATH=/usr/bin:/bin"};
  sup.start_exec(4, spec);
  sup.run();
  CHECK(sup.exit_code() == 0);
  CHECK(cap.text(4, Stream::Stdout).find("bar arg0\n") == 0);
  CHECK(cap.text(4, Stream::Stdout).find("SigBlk:\t0000000000000000") != std::string::npos);
}

TEST_CASE("supervisor: fail_fast=false lets the others finish", "[supervisor]") {
  auto o = opts(nullptr);
  o.fail_fast = false;
  Supervisor sup(o);
  sup.start_fork(0, ForkSpec{[] { return 2; }, "", 0});
  sup.start_fork(1, ForkSpec{[] {
                               usleep(100000);
                               return 0;
                             },
                             "", 1});
  sup.run();
  CHECK(sup.exit_code() == 2);
  CHECK(sup.result(1).exit_code == 0);
  CHECK(sup.result(1).stop_signal_sent == 0);
}

TEST_CASE("supervisor: adopted worker exits via notify_exit - watch_fd callbacks run in the loop", "[supervisor]") {
  CaptureSink cap;
  Supervisor sup(opts(&cap));
  // An "external" worker: we create it, but tell the supervisor about it as if someone else did.
  auto out = sys::make_pipe("adopted out");
  auto err = sys::make_pipe("adopted err");
  fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out.write.get(), 1);
    std::printf("from adopted\n");
    std::fflush(stdout);
    _exit(6);
  }
  out.write.reset();
  err.write.reset();
  sup.adopt(7, pid, 0, std::move(out.read), std::move(err.read), "");
  // A status channel, like a forkserver's: our waitpid result is sent over a pipe.
  auto chan = sys::make_pipe("status channel");
  int st = 0;
  REQUIRE(waitpid(pid, &st, 0) == pid);
  REQUIRE(write(chan.write.get(), &st, sizeof st) == sizeof st);
  int callbacks = 0;
  sup.watch_fd(chan.read.get(), POLLIN, [&](short) {
    int s;
    REQUIRE(read(chan.read.get(), &s, sizeof s) == sizeof s);
    ++callbacks;
    sup.unwatch_fd(chan.read.get());
    sup.notify_exit(7, s);
  });
  CHECK(sup.run_until(Clock::now() + 5s));
  CHECK(callbacks == 1);
  CHECK(sup.result(7).exit_code == 6);
  CHECK(sup.exit_code() == 6);
  CHECK(cap.text(7, Stream::Stdout) == "from adopted\n");
}

TEST_CASE("supervisor: destroying it before the end kills and reaps the workers", "[supervisor]") {
  pid_t pid;
  {
    Supervisor sup(opts(nullptr));
    pid = sup.start_fork(0, ForkSpec{wait_forever, "", 0});
    CHECK(kill(pid, 0) == 0);
  }
  CHECK(kill(pid, 0) == -1);  // reaped: gone entirely, not a zombie
  CHECK(errno == ESRCH);
}

TEST_CASE("supervisor: forwarded signals arrive as events (SIGUSR1 forwarded - run continues)", "[supervisor]") {
  auto o = opts(nullptr);
  o.forward_signals = {SIGUSR1, SIGTERM};
  std::vector<std::string> infos;
  o.on_info = [&](const std::string& l) { infos.push_back(l); };
  CaptureSink cap;
  o.sinks.push_back(&cap);
  Supervisor sup(o);
  // The worker exits 0 when it gets USR1 (it restores default handlers, so install one).
  auto p = sys::make_pipe("ready");
  sup.start_fork(0, ForkSpec{[&] {
                               signal(SIGUSR1, [](int) { _exit(0); });
                               (void)!write(p.write.get(), "r", 1);
                               return wait_forever();
                             },
                             "", 0});
  char c;
  REQUIRE(read(p.read.get(), &c, 1) == 1);
  kill(getpid(), SIGUSR1);  // blocked here, read from the signalfd by the loop
  CHECK(sup.run_until(Clock::now() + 5s));
  CHECK(sup.exit_code() == 0);
  CHECK(sup.stop_signal() == 0);
  REQUIRE_FALSE(infos.empty());
  CHECK(infos[0] == "received SIGUSR1; forwarding it to every worker");
}

TEST_CASE("supervisor: a forwarded signal still pending when the run has ended does not kill the caller",
          "[supervisor]") {
  // As under Slurm's scancel -s USR2: the signal reaches lspawn while its workers have already
  // exited 0; the supervisor is destroyed before a step() read it. In a child process, so that
  // the signal's default action (the bug) kills the child, not the test.
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    int code = 3;
    {
      auto o = opts(nullptr);
      o.forward_signals = {SIGUSR2, SIGTERM};
      Supervisor sup(o);
      sup.start_fork(0, ForkSpec{[] { return 0; }, "", 0});
      if (sup.run_until(Clock::now() + 5s) && sup.exit_code() == 0) code = 0;
      ::kill(::getpid(), SIGUSR2);  // blocked: pending until the supervisor goes
    }
    ::_exit(code);  // reached only if the pending SIGUSR2 was not delivered at its default action
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  INFO("child status " << status);
  CHECK_FALSE(WIFSIGNALED(status));
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("supervisor: grace period 0 kills at once - kill_now() from the caller", "[supervisor]") {
  {
    Supervisor sup(opts(nullptr, 0ms));
    sup.start_fork(0, ForkSpec{[] {
                                 signal(SIGTERM, SIG_IGN);
                                 return wait_forever();
                               },
                               "", 0});
    sup.start_fork(1, ForkSpec{[] { return 9; }, "", 1});
    CHECK(sup.run_until(Clock::now() + 5s));
    CHECK(sup.exit_code() == 9);
    CHECK(sup.result(0).term_signal == SIGKILL);
    CHECK(sup.result(0).stop_signal_sent == SIGKILL);
  }
  {
    Supervisor sup(opts(nullptr, 60000ms));
    sup.start_fork(0, ForkSpec{wait_forever, "", 0});
    sup.kill_now();
    CHECK(sup.phase() == Phase::Killing);
    CHECK(sup.run_until(Clock::now() + 5s));
    CHECK(sup.result(0).term_signal == SIGKILL);
    CHECK(sup.result(0).killed_by_supervisor());
  }
}

TEST_CASE(
    "supervisor: stop_workers stops for someone else - no stop signal, no root cause - earliest_failure sees failures "
    "while stopping",
    "[supervisor][multinode]") {
  Supervisor sup(opts(nullptr, 2000ms));
  sup.start_fork(0, ForkSpec{[] { return wait_forever(); }, "", 0});
  // Rank 1 exits 4 when told to stop: a failure of its own, though it came while stopping. It
  // says so on a pipe once its handler is installed (an event: a loaded machine may take long).
  int installed[2];
  REQUIRE(::pipe(installed) == 0);
  const int installed_w = installed[1];
  sup.start_fork(1, ForkSpec{[installed_w] {
                               struct sigaction sa {};
                               sa.sa_handler = [](int) { _exit(4); };
                               sigaction(SIGTERM, &sa, nullptr);
                               (void)!::write(installed_w, "1", 1);
                               return wait_forever();
                             },
                             "", 1});
  ::close(installed[1]);
  pollfd pfd{installed[0], POLLIN, 0};
  REQUIRE(::poll(&pfd, 1, 30000) == 1);
  ::close(installed[0]);
  sup.stop_workers();
  CHECK(sup.phase() == Phase::Stopping);
  sup.run();
  CHECK(sup.stop_signal() == 0);
  CHECK_FALSE(sup.root_cause());
  CHECK(sup.result(0).killed_by_supervisor());
  REQUIRE(sup.earliest_failure());
  CHECK(*sup.earliest_failure() == 1);
  CHECK(Supervisor::failure_exit_code(sup.result(1)) == 4);
  CHECK(sup.failure_report(1).find("lspawn: root cause: process 1 terminated with exit code 4\n") == 0);
  CHECK(sup.root_cause_report().empty());
}

TEST_CASE("supervisor: new_round runs a second round on the same supervisor - not while running",
          "[supervisor][multinode]") {
  CaptureSink cap;
  Supervisor sup(opts(&cap));
  sup.start_fork(0, ForkSpec{[] { return 3; }, "", 0});
  sup.start_fork(1, ForkSpec{[] { return wait_forever(); }, "", 1});
  CHECK_THROWS_AS(sup.new_round(), std::logic_error);
  sup.run();
  CHECK(sup.exit_code() == 3);
  CHECK(sup.root_cause() == 0);
  sup.new_round();
  CHECK(sup.results().empty());
  CHECK_FALSE(sup.root_cause());
  sup.start_fork(0, ForkSpec{[] { return 0; }, "", 0});  // the same ranks again
  sup.start_fork(1, ForkSpec{[] { return 0; }, "", 1});
  sup.run();
  CHECK(sup.exit_code() == 0);
  CHECK(sup.summary().empty());
}

TEST_CASE("supervisor: a shm segment a killed worker left is removed when it is reaped", "[supervisor]") {
  // The shm backend's rank 0 SIGKILLed between shm_open and shm_unlink (sys/shm_segments.hpp).
  Supervisor sup(opts(nullptr));
  sup.start_fork(0, ForkSpec{[] {
                               const std::string name = sys::shm_segment_name("suptest", ::getpid(), 0x5e9);
                               const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
                               if (fd < 0) return 10;
                               ::raise(SIGKILL);
                               return 11;
                             },
                             "", 0});
  const pid_t pid = sup.result(0).pid;
  const std::string path = "/dev/shm" + sys::shm_segment_name("suptest", pid, 0x5e9);
  // Another pid's segment of the same form is not the worker's: it stays.
  const std::string other = sys::shm_segment_name("suptest", ::getpid(), 0x5e9);
  const int ofd = ::shm_open(other.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  REQUIRE(ofd >= 0);
  ::close(ofd);
  sup.run();
  CHECK(sup.result(0).term_signal == SIGKILL);
  struct stat st {};
  CHECK(::stat(path.c_str(), &st) != 0);
  CHECK(::stat(("/dev/shm" + other).c_str(), &st) == 0);
  ::shm_unlink(other.c_str());
}
