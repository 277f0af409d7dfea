// `lspawn daemon` and `lspawn --start-method warm` (docs/warm-start.md): what is specific to
// warm starts. (The rest of the e2e suite also runs under --start-method warm: ctest's "warm: "
// tests, one daemon per test process.)
#include <catch2/catch.hpp>

#include <fstream>
#include <memory>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <linux/capability.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.hpp"

using namespace lspawn::test;
using namespace std::chrono_literals;

namespace {

std::vector<std::string> warm(const Daemon& d, std::vector<std::string> rest) {
  std::vector<std::string> a = d.warm_args();
  a.insert(a.end(), rest.begin(), rest.end());
  return a;
}

// From lspawn's "<new|warm> forkserver (pid F, run R) of the daemon (pid D) ...; this run's
// server: pid S" line.
struct WarmLine {
  bool found = false;
  bool reused = false;
  pid_t forkserver = 0, server = 0;
  int run = 0;
};
WarmLine warm_line(const std::string& err) {
  static const std::regex re(
      R"((new|warm) forkserver \(pid (\d+), run (\d+)\) of the daemon \(pid \d+\) on .*; this run's server: pid (\d+))");
  std::smatch m;
  WarmLine w;
  if (!std::regex_search(err, m, re)) return w;
  w.found = true;
  w.reused = m[1] == "warm";
  w.forkserver = std::stoi(m[2]);
  w.run = std::stoi(m[3]);
  w.server = std::stoi(m[4]);
  return w;
}

// NAME=value lines of the `env` worker for rank 0.
std::string var(const std::string& out, const std::string& name) {
  for (const auto& l : lines(out)) {
    const std::string key = "[rank 0] " + name + "=";
    if (l.compare(0, key.size(), key) == 0) return l.substr(key.size());
  }
  return "<missing>";
}

// The parent pid of `pid`, from /proc (0 when gone).
pid_t parent_of(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s;
  if (!std::getline(f, s)) return 0;
  std::istringstream is(s.substr(s.rfind(')') + 2));
  char state;
  pid_t ppid = 0;
  is >> state >> ppid;
  return ppid;
}

// "pids SELF CHILD PARENT" lines of child-then-wait workers: every pid named.
std::set<pid_t> pids_in(const std::string& out) {
  std::set<pid_t> all;
  for (const auto& l : lines(out)) {
    const auto at = l.find("pids ");
    if (at == std::string::npos) continue;
    std::istringstream is(l.substr(at + 5));
    pid_t p;
    while (is >> p) all.insert(p);
  }
  return all;
}

int unix_connect(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Reads what the peer sends until EOF or 5 s.
std::string read_all(int fd) {
  std::string got;
  char buf[4096];
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) got.append(buf, static_cast<size_t>(n));
  return got;
}

// argv of an lspawn run.
std::vector<std::string> with_bin(std::vector<std::string> args) {
  args.insert(args.begin(), lspawn_bin());
  return args;
}

// A warm run of 2 child-then-wait workers, once both printed their pids; *w: its warm line.
std::unique_ptr<Child> start_waiting(const Daemon& d, WarmLine* w) {
  auto c = std::make_unique<Child>(with_bin(warm(d, {"--nprocs", "2", worker_bin(), "child-then-wait"})));
  INFO(c->err());
  REQUIRE(c->wait_stdout_count("pids ", 2, 10s));
  *w = warm_line(c->err());
  REQUIRE(w->found);
  return c;
}

std::string status_of(const Daemon& d) { return run_lspawn({"daemon", "--status", "--socket", d.socket()}).out; }

}  // namespace

TEST_CASE("warm: the second run reuses the daemon's forkserver - with its own environment and directory and umask",
          "[e2e][forkserver][warm]") {
  Daemon d;
  auto r1 = run_lspawn(warm(d, {"--nprocs", "2", worker_bin(), "env"}));
  INFO(r1.err);
  REQUIRE(r1.exit_code == 0);
  auto r2 = run_lspawn(warm(d, {"--nprocs", "2", worker_bin(), "env"}));
  INFO(r2.err);
  REQUIRE(r2.exit_code == 0);
  const WarmLine w1 = warm_line(r1.err), w2 = warm_line(r2.err);
  REQUIRE(w1.found);
  REQUIRE(w2.found);
  CHECK_FALSE(w1.reused);
  CHECK(w2.reused);
  CHECK(w1.forkserver == w2.forkserver);
  CHECK(w1.run == 1);
  CHECK(w2.run == 2);
  CHECK(w1.server != w2.server);  // a server of its own per run
  // Run 2's contract, not run 1's: per-run values differ, the rest is right.
  for (const char* name : {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "LSPAWN_RUN_DIR", "TORCHELASTIC_ERROR_FILE"}) {
    INFO(name);
    CHECK(var(r1.out, name) != var(r2.out, name));
    CHECK(var(r2.out, name) != "<unset>");
  }
  CHECK(r2.out.find("[rank 1] RANK=1") != std::string::npos);
  CHECK(r2.out.find("[rank 1] WORLD_SIZE=2") != std::string::npos);
  CHECK(var(r2.out, "LSPAWN_FORKSERVER_FDS") == "<unset>");
  CHECK(status_of(d).find("runs 2") != std::string::npos);

  // Runs from another directory, with another umask: the workers get that run's (the
  // forkserver is the same: the shell's PWD, OLDPWD, SHLVL and _ are not part of its key).
  TempDir elsewhere;
  auto from = [&](const std::string& dir, const std::string& mask) {
    Child c({"/bin/sh", "-c", "cd '" + dir + "' && umask " + mask + " && exec \"$0\" \"$@\"", lspawn_bin(),
             "--start-method", "warm", "--daemon-socket", d.socket(), "--nprocs", "2", worker_bin(), "cwd"});
    REQUIRE(code_of(c.wait(20s)) == 0);
    return std::make_pair(c.out(), warm_line(c.err()));
  };
  const auto first = from("/", "022");
  const auto [out, w] = from(elsewhere.path, "027");
  INFO(out);
  CHECK(first.first.find("[rank 1] cwd=/ umask=022") != std::string::npos);
  CHECK(w.reused);
  CHECK(w.forkserver == first.second.forkserver);
  CHECK(out.find("[rank 0] cwd=" + elsewhere.path + " umask=027") != std::string::npos);
  CHECK(out.find("[rank 1] cwd=" + elsewhere.path + " umask=027") != std::string::npos);
}

TEST_CASE("warm: workers are forked by this run's server - a child of the warm forkserver", "[e2e][forkserver][warm]") {
  Daemon d;
  WarmLine w;
  auto child = start_waiting(d, &w);
  Child& c = *child;
  for (const auto& l : lines(c.out())) {
    const auto at = l.find("pids ");
    if (at == std::string::npos) continue;
    std::istringstream is(l.substr(at + 5));
    pid_t self, child, parent;
    REQUIRE(is >> self >> child >> parent);
    CHECK(parent == w.server);
    CHECK(parent_of(parent) == w.forkserver);
    CHECK(parent_of(w.forkserver) == d.pid());
  }
  c.signal(SIGTERM);
  CHECK(code_of(c.wait(20s)) == 143);
}

TEST_CASE("warm: a changed program gets a new forkserver - the old one is stopped", "[e2e][forkserver][warm]") {
  Daemon d;
  TempDir dir;
  const std::string prog = dir.path + "/worker";
  auto copy = [&] {
    std::ifstream in(worker_bin(), std::ios::binary);
    std::ofstream out(prog, std::ios::binary | std::ios::trunc);
    out << in.rdbuf();
    out.close();
    ::chmod(prog.c_str(), 0755);
  };
  copy();
  auto r1 = run_lspawn(warm(d, {"--nprocs", "2", prog, "env"}));
  REQUIRE(r1.exit_code == 0);
  std::this_thread::sleep_for(10ms);  // a new mtime even on a coarse clock
  copy();                             // rewritten in place: same inode, new mtime and ctime
  auto r2 = run_lspawn(warm(d, {"--nprocs", "2", prog, "env"}));
  INFO(r2.err << d.process().err());
  REQUIRE(r2.exit_code == 0);
  const WarmLine w1 = warm_line(r1.err), w2 = warm_line(r2.err);
  REQUIRE(w1.found);
  REQUIRE(w2.found);
  CHECK_FALSE(w2.reused);
  CHECK(w1.forkserver != w2.forkserver);
  CHECK(alive_after({w1.forkserver}, 5s).empty());
  const std::string st = status_of(d);
  CHECK(st.find("1 forkserver") != std::string::npos);
  CHECK(st.find("pid " + std::to_string(w2.forkserver)) != std::string::npos);
}

TEST_CASE("warm: a failing rank gives the report and exit code of a cold run", "[e2e][forkserver][warm]") {
  Daemon d;
  // Rank 1 fails only once every rank is up (LSPAWN_TEST_SYNC_DIR, emptied before each run):
  // else a fast failure can stop a run before rank 2 starts ("rank 2 not started"), in one run
  // and not the other. One directory for all runs: the warm forkserver is reused only for the
  // same environment.
  TempDir sync;
  auto run = [&sync](const std::vector<std::string>& args) {
    for (int r = 0; r < 3; ++r) ::unlink((sync.path + "/ready-" + std::to_string(r)).c_str());
    return run_lspawn(args, {"LSPAWN_TEST_SYNC_DIR=" + sync.path});
  };
  REQUIRE(run(warm(d, {"--nprocs", "3", worker_bin(), "exit-rank", "1", "3"})).exit_code == 3);
  auto warm_run = run(warm(d, {"--nprocs", "3", worker_bin(), "exit-rank", "1", "3"}));
  auto cold_run = run({"--start-method", "forkserver", "--nprocs", "3", worker_bin(), "exit-rank", "1", "3"});
  INFO(warm_run.err << "\n---\n" << cold_run.err);
  REQUIRE(warm_line(warm_run.err).reused);
  CHECK(warm_run.exit_code == 3);
  CHECK(cold_run.exit_code == 3);
  // The same summary, but for pids, times and paths.
  auto summary = [](const std::string& err) {
    std::string s;
    for (const auto& l : lines(err)) {
      if (l.find("root cause") != std::string::npos || l.find("rank 1 of 3") != std::string::npos ||
          l.find("terminated by lspawn") != std::string::npos) {
        s += std::regex_replace(l, std::regex(R"(pid \d+|after [0-9.]+ s)"), "#") + "\n";
      }
    }
    return s;
  };
  CHECK(summary(warm_run.err) == summary(cold_run.err));
  CHECK(summary(warm_run.err).find("root cause: process 1 terminated with exit code 3") != std::string::npos);
}

TEST_CASE("warm: SIGTERM or SIGKILL to lspawn stops its workers - the forkserver stays warm",
          "[e2e][forkserver][warm]") {
  Subreaper reaper;
  Daemon d;
  for (int sig : {SIGTERM, SIGKILL}) {
    INFO("signal " << sig);
    WarmLine w;
    auto child = start_waiting(d, &w);
    Child& c = *child;
    const std::set<pid_t> pids = pids_in(c.out());  // workers, their children, the run's server
    c.signal(sig);
    CHECK(code_of(c.wait(20s)) == 128 + sig);
    CHECK(alive_after(pids, 2s).empty());
    CHECK(alive(w.forkserver));
  }
  CHECK(status_of(d).find("runs 2, running 0") != std::string::npos);
}

TEST_CASE("warm: killing the daemon kills its forkservers and their workers - 0 processes left",
          "[e2e][forkserver][warm]") {
  Subreaper reaper;  // the forkservers' orphans come here to be reaped
  Daemon d;
  WarmLine w;
  auto child = start_waiting(d, &w);
  Child& c = *child;
  std::set<pid_t> pids = pids_in(c.out());
  pids.insert(w.forkserver);
  pids.insert(w.server);
  ::kill(d.pid(), SIGKILL);
  const int status = c.wait(20s);
  INFO(c.err());
  CHECK(code_of(status) == 137);  // the workers died of SIGKILL: the root cause
  CHECK(c.err().find("died; its workers died with it") != std::string::npos);
  CHECK(alive_after(pids, 2s).empty());
}

TEST_CASE("warm: a peer with another uid is refused - named by its pid and uid", "[e2e][forkserver][warm]") {
  if (::geteuid() != 0) {
    WARN("skipped: needs root to connect as another uid");
    return;
  }
  Daemon d;
  int p[2];
  REQUIRE(::pipe(p) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // uid 65534 that keeps CAP_DAC_OVERRIDE: the 0700 directory lets it through, so only the
    // daemon's SO_PEERCRED check can refuse it.
    ::prctl(PR_SET_KEEPCAPS, 1);
    if (::setresgid(65534, 65534, 65534) != 0 || ::setresuid(65534, 65534, 65534) != 0) ::_exit(3);
    __user_cap_header_struct h{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct caps[2] = {};
    if (::syscall(SYS_capget, &h, caps) != 0) ::_exit(4);
    caps[0].effective = caps[0].permitted;
    if (::syscall(SYS_capset, &h, caps) != 0) ::_exit(5);
    const int fd = unix_connect(d.socket());
    if (fd < 0) ::_exit(6);
    const std::string reply = read_all(fd);
    (void)!::write(p[1], reply.data(), reply.size());
    ::_exit(0);
  }
  ::close(p[1]);
  const std::string reply = read_all(p[0]);
  ::close(p[0]);
  int st = 0;
  ::waitpid(child, &st, 0);
  REQUIRE(WIFEXITED(st));
  REQUIRE(WEXITSTATUS(st) == 0);
  const std::string expect = "refused connection from pid " + std::to_string(child) + " (uid 65534)";
  CHECK(reply.find(expect) != std::string::npos);  // the reply's error text says it too
  CHECK(d.process().wait_output(
      [&](const std::string&, const std::string& err) { return err.find(expect) != std::string::npos; }, 5s));
  CHECK(run_lspawn(warm(d, {"--nprocs", "2", worker_bin(), "env"})).exit_code == 0);  // and it goes on
}

TEST_CASE("warm: garbage on the daemon socket is survived with a message", "[e2e][forkserver][warm]") {
  Daemon d;
  std::mt19937 rng(11);
  std::string junk(8192, '\0');
  for (auto& b : junk) b = static_cast<char>(rng());
  junk[0] = 0x10;  // a length within the bound: the decoder, not the bound, rejects it
  junk[1] = junk[2] = junk[3] = 0;
  const std::vector<std::string> attacks = {
      junk, std::string("\xff\xff\xff\x7f", 4),                     // a 2 GiB frame
      std::string("\x05\x00\x00\x00\xa1\x62op\x63", 9),             // a valid header, broken CBOR
      std::string("\x02\x00\x00\x00", 4) + std::string("\xa0", 1),  // half a frame, then EOF
  };
  for (const auto& a : attacks) {
    const int fd = unix_connect(d.socket());
    REQUIRE(fd >= 0);
    (void)!::send(fd, a.data(), a.size(), MSG_NOSIGNAL);
    ::shutdown(fd, SHUT_WR);
    (void)read_all(fd);
    ::close(fd);
  }
  auto& log = d.process();
  CHECK(log.wait_output([](const std::string&, const std::string& err) { return count(err, "bad frame (") >= 3; }, 5s));
  CHECK(log.wait_output(
      [](const std::string&, const std::string& err) { return err.find("incomplete request") != std::string::npos; },
      5s));
  INFO(log.err());
  CHECK(log.err().find("exceeds") != std::string::npos);
  auto r = run_lspawn(warm(d, {"--nprocs", "2", worker_bin(), "env"}));
  CHECK(r.exit_code == 0);
  CHECK(warm_line(r.err).found);
}

TEST_CASE("warm: no daemon - a cold forkserver said once - a second daemon and an open directory are refused",
          "[e2e][forkserver][warm]") {
  TempDir dir;
  auto r = run_lspawn(
      {"--start-method", "warm", "--daemon-socket", dir.path + "/none.sock", "--nprocs", "2", worker_bin(), "env"});
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(count(r.err, "no daemon on " + dir.path + "/none.sock") == 1);
  CHECK(count(r.out, "RANK=") >= 2);

  Daemon d;
  auto second = run_lspawn({"daemon", "--socket", d.socket()});
  CHECK(second.exit_code == 1);
  CHECK(second.err.find("already listens on " + d.socket()) != std::string::npos);

  REQUIRE(::chmod(dir.path.c_str(), 0755) == 0);
  auto open_dir = run_lspawn({"daemon", "--socket", dir.path + "/d.sock"});
  CHECK(open_dir.exit_code == 1);
  CHECK(open_dir.err.find("is not a private directory") != std::string::npos);
  CHECK(open_dir.err.find("mode 0755") != std::string::npos);
}
