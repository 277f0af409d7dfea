#include "supervisor/job_secret.hpp"

#include <cerrno>
#include <cstdlib>
#include <stdexcept>

#include <sys/syscall.h>
#include <unistd.h>

#include "supervisor/env_contract.hpp"
#include "sys/sys.hpp"

namespace lspawn {

std::string generate_job_secret() {
  unsigned char raw[32];
  size_t got = 0;
  while (got < sizeof raw) {
    // The system call, not glibc's getrandom() (2.25): the manylinux2014 wheel runs on glibc 2.17
    // (scripts/build-wheel-cross.sh); the call itself is Linux 3.17's.
    const ssize_t n = ::syscall(SYS_getrandom, raw + got, sizeof raw - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      sys::throw_errno("getrandom", "job secret");
    }
    got += static_cast<size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * sizeof raw);
  for (unsigned char c : raw) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

std::string random_run_id() { return generate_job_secret().substr(0, 16); }

std::optional<std::string> job_secret_from_environment() {
  const char* v = std::getenv(env::kLspawnJobSecret);
  if (v == nullptr || *v == '\0') return std::nullopt;
  std::string s(v);
  if (s.size() < 16) {
    throw std::invalid_argument(std::string(env::kLspawnJobSecret) + " is too short (" + std::to_string(s.size()) +
                                " characters, at least 16 needed)");
  }
  return s;
}

}  // namespace lspawn
