// Test helper: start a real child process by exec (posix_spawn) with a chosen environment and its
// output in a file, wait for it with an upper bound, kill it if it overstays. Tests only.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include <sys/types.h>

namespace lspawn::test {

// A temp directory (mkdtemp) removed with its content on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A port bound with SO_REUSEADDR on 0.0.0.0 and NOT listening, as lspawn reserves MASTER_PORT.
// Connections to it are refused until a server (e.g. TCPStore) binds and listens on it.
class ReservedPort {
 public:
  explicit ReservedPort(bool listening = false);
  ~ReservedPort();
  ReservedPort(const ReservedPort&) = delete;
  ReservedPort& operator=(const ReservedPort&) = delete;
  uint16_t port() const { return port_; }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

struct ExitStatus {
  bool exited = false;   // exited normally
  int code = -1;         // valid when exited
  int signal = 0;        // terminating signal, when !exited
  bool timed_out = false;  // killed by wait() after its deadline
  std::string describe() const;
};

class Child {
 public:
  // Starts argv[0] (a path) with the test's environment minus the env-contract variables, plus
  // `env`. stdout and stderr go to `output_path`.
  Child(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
        const std::string& output_path);
  ~Child();  // kills (SIGKILL) and reaps a child still running
  Child(Child&& other) noexcept;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  // Waits at most `limit`; then SIGKILLs it and reports timed_out.
  ExitStatus wait(std::chrono::milliseconds limit);
  std::string output() const;  // the content of the output file

 private:
  pid_t pid_ = -1;
  std::string output_path_;
};

std::string read_file(const std::string& path);

// The env contract of rank `rank` of a single-node job of `n` ranks on 127.0.0.1:port.
std::map<std::string, std::string> contract_env(int rank, int n, uint16_t port,
                                                const std::string& run_id = "test");

}  // namespace lspawn::test
