// Error-report files written by workers (any program, Python's @record included):
// read_error_file never throws and never crashes, whatever the file holds.
#include <cstddef>
#include <cstdint>
#include <string>

#include <sys/mman.h>
#include <unistd.h>

#include "supervisor/error_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = ::memfd_create("error-file", MFD_CLOEXEC);
  if (fd < 0) return 0;
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd, data + done, size - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  const auto result = lspawn::read_error_file("/proc/self/fd/" + std::to_string(fd));
  if (result.report) (void)result.report->message.size();
  ::close(fd);
  return 0;
}
