#include "tests/runtime/child.hpp"

#include <cerrno>
#include <csignal>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <arpa/inet.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace lspawn::test {
namespace {

[[noreturn]] void fail(const std::string& call) {
  throw std::runtime_error(call + ": " + std::strerror(errno));
}

bool is_contract_var(const std::string& name) {
  static const char* const kNames[] = {
      "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
      "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"};
  for (const char* n : kNames) {
    if (name == n) return true;
  }
  return name.rfind("TORCHELASTIC_", 0) == 0 || name.rfind("LSPAWN_", 0) == 0;
}

}  // namespace

TempDir::TempDir() {
  std::string tmpl = (std::getenv("TMPDIR") ? std::string(std::getenv("TMPDIR")) : "/tmp") +
                     "/lspawn-runtime-test.XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) fail("mkdtemp");
  path_ = tmpl;
}

TempDir::~TempDir() {
  ::nftw(
      path_.c_str(), [](const char* p, const struct stat*, int, FTW*) { return ::remove(p); }, 16,
      FTW_DEPTH | FTW_PHYS);
}

ReservedPort::ReservedPort(bool listening) {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) fail("socket");
  int one = 1;
  if (::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0) fail("setsockopt");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) fail("bind");
  socklen_t len = sizeof a;
  if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) fail("getsockname");
  port_ = ntohs(a.sin_port);
  if (listening && ::listen(fd_, 4) != 0) fail("listen");
}

ReservedPort::~ReservedPort() {
  if (fd_ >= 0) ::close(fd_);
}

std::string ExitStatus::describe() const {
  if (timed_out) return "timed out (killed)";
  if (exited) return "exit code " + std::to_string(code);
  return std::string("signal ") + strsignal(signal);
}

Child::Child(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
             const std::string& output_path)
    : output_path_(output_path) {
  std::vector<std::string> envs;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    const std::string name = kv.substr(0, kv.find('='));
    if (!is_contract_var(name) && env.count(name) == 0) envs.push_back(kv);
  }
  for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : envs) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = argv;
  std::vector<char*> argp;
  for (auto& s : args) argp.push_back(s.data());
  argp.push_back(nullptr);

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, output_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  std::fflush(nullptr);
  const int rc = ::posix_spawn(&pid_, argp[0], &fa, nullptr, argp.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    errno = rc;
    fail("posix_spawn " + argv[0]);
  }
}

Child::Child(Child&& other) noexcept : pid_(other.pid_), output_path_(std::move(other.output_path_)) {
  other.pid_ = -1;
}

Child::~Child() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int st;
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
  }
}

ExitStatus Child::wait(std::chrono::milliseconds limit) {
  ExitStatus s;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int st = 0;
  while (true) {
    const pid_t r = ::waitpid(pid_, &st, WNOHANG);
    if (r == pid_) break;
    if (r < 0 && errno != EINTR) fail("waitpid");
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid_, SIGKILL);
      while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
      }
      s.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  pid_ = -1;
  if (WIFEXITED(st)) {
    s.exited = true;
    s.code = WEXITSTATUS(st);
  } else if (WIFSIGNALED(st)) {
    s.signal = WTERMSIG(st);
  }
  return s;
}

std::string Child::output() const { return read_file(output_path_); }

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::map<std::string, std::string> contract_env(int rank, int n, uint16_t port,
                                                const std::string& run_id) {
  return {{"RANK", std::to_string(rank)},
          {"LOCAL_RANK", std::to_string(rank)},
          {"WORLD_SIZE", std::to_string(n)},
          {"LOCAL_WORLD_SIZE", std::to_string(n)},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", std::to_string(port)},
          {"TORCHELASTIC_RUN_ID", run_id},
          {"OMP_NUM_THREADS", "1"}};
}

}  // namespace lspawn::test
