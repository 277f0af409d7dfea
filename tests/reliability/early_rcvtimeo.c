// LD_PRELOAD shim for the fault matrix: every receive timeout longer than 200 ms that a process
// sets on a socket (setsockopt SO_RCVTIMEO, what c10d's TCPStore client does for each wait) is
// shortened by LSPAWN_TEST_RCVTIMEO_EARLY_MS (default 30 ms). So a store wait ends that much
// before its deadline, as the kernel may end one (it counts the timeout in timer ticks), but every
// time: the race the rendezvous's timer slack answers, made deterministic. That is 1.13's store
// wait; on LibTorch 2.x the client polls until its own deadline (Socket::waitForInput), so this
// shim changes nothing there and the test checks the plain timeout.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/time.h>

typedef int (*setsockopt_fn)(int, int, int, const void*, socklen_t);

int setsockopt(int fd, int level, int name, const void* value, socklen_t length) {
  static setsockopt_fn real;
  if (!real) real = (setsockopt_fn)dlsym(RTLD_NEXT, "setsockopt");
  if (level == SOL_SOCKET && name == SO_RCVTIMEO && value && length == sizeof(struct timeval)) {
    const struct timeval* tv = (const struct timeval*)value;
    const long long us = (long long)tv->tv_sec * 1000000 + tv->tv_usec;
    const char* e = getenv("LSPAWN_TEST_RCVTIMEO_EARLY_MS");
    const long long early_us = (e && *e ? atoll(e) : 30) * 1000;
    if (us > 200000 && early_us > 0 && early_us < us) {
      const long long shorter = us - early_us;
      struct timeval t = {(time_t)(shorter / 1000000), (suseconds_t)(shorter % 1000000)};
      return real(fd, level, name, &t, length);
    }
  }
  return real(fd, level, name, value, length);
}
