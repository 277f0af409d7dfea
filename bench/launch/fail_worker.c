/* A worker for the fail-fast benchmark. Every rank sleeps; rank FAIL_RANK (default 1) sleeps
 * FAIL_AFTER_MS (default 1000), writes CLOCK_REALTIME in ns to $FAIL_TS_FILE, and exits 3.
 * The others stop on SIGTERM (default action), as a well-behaved worker does. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static long env_long(const char* name, long dflt) {
  const char* v = getenv(name);
  return v && *v ? strtol(v, NULL, 10) : dflt;
}

int main(void) {
  long rank = env_long("RANK", env_long("OMPI_COMM_WORLD_RANK", 0));
  if (rank != env_long("FAIL_RANK", 1)) {
    sleep(60);
    return 0;
  }
  long ms = env_long("FAIL_AFTER_MS", 1000);
  struct timespec d = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&d, NULL);
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  const char* path = getenv("FAIL_TS_FILE");
  if (path) {
    FILE* f = fopen(path, "w");
    if (f) {
      fprintf(f, "%lld\n", (long long)now.tv_sec * 1000000000LL + now.tv_nsec);
      fclose(f);
    }
  }
  return 3;
}
