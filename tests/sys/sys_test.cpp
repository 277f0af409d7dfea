#include <catch2/catch.hpp>

#include <climits>
#include <cstdlib>
#include <fstream>

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support/loopback.hpp"
#include "sys/sys.hpp"

namespace sys = lspawn::sys;

TEST_CASE("sys: wait status wording follows torch.multiprocessing", "[sys]") {
  CHECK(sys::describe_wait_status(3 << 8) == "terminated with exit code 3");
  CHECK(sys::describe_wait_status(0) == "exited with code 0");
  CHECK(sys::describe_wait_status(SIGSEGV) == "terminated with signal SIGSEGV");
  CHECK(sys::shell_exit_code(SIGKILL) == 137);
  CHECK(sys::shell_exit_code(3 << 8) == 3);
  CHECK(sys::signal_name(SIGTERM) == "SIGTERM");
  CHECK(sys::signal_name(SIGRTMIN + 40).find("signal ") == 0);
}

TEST_CASE("sys: errors name the call - the context and errno text", "[sys]") {
  try {
    sys::waitpid(999999, nullptr, WNOHANG, "rank 7");
    FAIL();
  } catch (const sys::SysError& e) {
    CHECK(std::string(e.what()) == "waitpid(999999) (rank 7): No child processes");
    CHECK(e.error() == ECHILD);
  }
  CHECK_FALSE(sys::kill(999999, 0, "probe"));  // ESRCH is an answer, not an error
}

TEST_CASE("sys: pipes are close-on-exec - Fd closes", "[sys]") {
  int raw;
  {
    auto p = sys::make_pipe("t");
    CHECK((fcntl(p.read.get(), F_GETFD) & FD_CLOEXEC) != 0);
    CHECK((fcntl(p.write.get(), F_GETFD) & FD_CLOEXEC) != 0);
    raw = p.read.get();
  }
  CHECK(fcntl(raw, F_GETFD) == -1);
}

TEST_CASE("sys: find_executable searches PATH like execvp", "[sys]") {
  int err = 0;
  auto sh = sys::find_executable("sh", &err);
  REQUIRE(sh);
  CHECK(sh->back() == 'h');
  CHECK_FALSE(sys::find_executable("lspawn-surely-absent-xyz", &err));
  CHECK(err == ENOENT);
  const std::string d = sys::make_temp_dir("lspawn-sys-");
  std::ofstream(d + "/noexec") << "x";
  chmod((d + "/noexec").c_str(), 0644);
  CHECK_FALSE(sys::find_executable(d + "/noexec", &err));
  CHECK(err == EACCES);
  CHECK_FALSE(sys::find_executable(d, &err));
  CHECK(err == EACCES);
  sys::remove_tree(d);
  CHECK(access(d.c_str(), F_OK) != 0);
}

TEST_CASE("sys: make_temp_dir under a relative TMPDIR returns an absolute path", "[sys]") {
  const std::string base = sys::make_temp_dir("lspawn-sys-rel-");
  char cwd[PATH_MAX];
  REQUIRE(getcwd(cwd, sizeof cwd));
  const char* old_tmp = std::getenv("TMPDIR");
  const std::string saved = old_tmp ? old_tmp : "";
  REQUIRE(chdir(base.c_str()) == 0);
  char here[PATH_MAX];
  REQUIRE(getcwd(here, sizeof here));
  REQUIRE(mkdir("tmp", 0700) == 0);
  setenv("TMPDIR", "tmp", 1);
  const std::string d = sys::make_temp_dir("lspawn-x-");
  if (old_tmp) {
    setenv("TMPDIR", saved.c_str(), 1);
  } else {
    unsetenv("TMPDIR");
  }
  REQUIRE(chdir(cwd) == 0);  // a later chdir must not lose it
  INFO(d);
  CHECK(d.rfind(std::string(here) + "/tmp/lspawn-x-", 0) == 0);
  CHECK(access(d.c_str(), F_OK) == 0);
  sys::remove_tree(base);
  CHECK(access(base.c_str(), F_OK) != 0);
}

TEST_CASE("sys: tcp_set_liveness - user timeout, keepalive and retransmissions at most 1 s apart", "[sys]") {
  sys::Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(fd.get() >= 0);
  sys::tcp_set_liveness(fd.get(), std::chrono::milliseconds(3000), "test socket");
  auto option = [&](int level, int name) {
    int v = -1;
    socklen_t len = sizeof v;
    return ::getsockopt(fd.get(), level, name, &v, &len) == 0 ? v : -errno;
  };
  CHECK(option(IPPROTO_TCP, TCP_USER_TIMEOUT) == 3000);
  CHECK(option(SOL_SOCKET, SO_KEEPALIVE) == 1);
  // TCP_RTO_MAX_MS (44): Linux 6.15 and later; the kernel's default is 120 s.
  const int rto_max = option(IPPROTO_TCP, 44);
  if (rto_max == -ENOPROTOOPT) {
    WARN("this kernel has no TCP_RTO_MAX_MS: retransmissions back off as before");
  } else {
    CHECK(rto_max == 1000);
  }
}

// The ceiling follows the measured round trip: on loopback (microseconds) it is the 1 s floor.
// (A 2 s one-way link, where it must rise past 4 s: bench/faults/slow_links.sh and ctest
// multinode_slow_link_2s, label long.)
TEST_CASE("sys: tcp_fit_retransmission_ceiling - 1 s on a link of microseconds", "[sys]") {
  lspawn::test::LoopbackListener listener;
  sys::Fd client(lspawn::test::connect_to(listener.port()));
  REQUIRE(client.get() >= 0);
  const int ceiling = sys::tcp_fit_retransmission_ceiling(client.get());
  int rto_max = -1;
  socklen_t len = sizeof rto_max;
  if (::getsockopt(client.get(), IPPROTO_TCP, 44, &rto_max, &len) != 0) {
    CHECK(ceiling == 0);  // no TCP_RTO_MAX_MS on this kernel
  } else {
    CHECK(ceiling == 1000);
    CHECK(rto_max == 1000);
  }
}

// What flush_for() waits on before a node exits (cluster/links.hpp): bytes the peer has not
// acknowledged. A peer that does not read fills its window; the bytes wait in the sender's queue
// until it drains them (discard_input), then none are left.
TEST_CASE("sys: tcp_unacknowledged counts what the peer has not taken, discard_input drains", "[sys]") {
  lspawn::test::LoopbackListener listener;
  sys::Fd client(lspawn::test::connect_to(listener.port()));
  REQUIRE(client.get() >= 0);
  sys::Fd server(::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
  REQUIRE(server.get() >= 0);
  CHECK(sys::tcp_unacknowledged(client.get()) == 0);
  const std::string chunk(64 * 1024, 'x');
  size_t sent = 0;
  for (ssize_t w; (w = ::send(client.get(), chunk.data(), chunk.size(), MSG_DONTWAIT | MSG_NOSIGNAL)) > 0;) {
    sent += static_cast<size_t>(w);
  }
  INFO(sent << " bytes sent before the socket was full");
  CHECK(sys::tcp_unacknowledged(client.get()) > 0);
  for (int i = 0; i < 2000 && sys::tcp_unacknowledged(client.get()) > 0; ++i) {
    sys::discard_input(server.get());
    ::usleep(1000);
  }
  CHECK(sys::tcp_unacknowledged(client.get()) == 0);
  CHECK(sys::tcp_unacknowledged(-1) == -1);
}
