#include "spawn/serial_executor.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "supervisor/env_contract.hpp"
#include "spawn/errors.hpp"
#include "sys/sys.hpp"

namespace lspawn {

SerialExecutor::SerialExecutor() {
  const char* dir = std::getenv(env::kLspawnRunDir);
  if (!dir || !*dir) {
    throw SpawnError(std::string("SerialExecutor: ") + env::kLspawnRunDir +
                     " is not set (not inside a spawn() or lspawn worker); pass a lock path");
  }
  lock_path_ = std::string(dir) + "/serial.lock";
}

SerialExecutor::SerialExecutor(std::string lock_path) : lock_path_(std::move(lock_path)) {}

SerialExecutor::Hold::Hold(const std::string& path) {
  // A fresh open file description per hold: flock locks belong to it, so holds in threads or
  // forked children of one process exclude each other too.
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd_ < 0) sys::throw_errno("open", "SerialExecutor lock " + path);
  while (::flock(fd_, LOCK_EX) != 0) {
    if (errno == EINTR) continue;
    const int err = errno;
    sys::close(fd_);
    errno = err;
    sys::throw_errno("flock", "SerialExecutor lock " + path);
  }
}

SerialExecutor::Hold::~Hold() { sys::close(fd_); }

}  // namespace lspawn
