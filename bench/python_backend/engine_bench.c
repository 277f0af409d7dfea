/* lspawn's shm engine alone (liblspawn_engine.so through shm/engine.h, no Python, no torch): the
 * baseline of the "Python overhead" figure of allreduce_bench.py. Forks N ranks; each creates the
 * engine with a file rendezvous (set: write a file in a temp dir, then rename it into place; get: poll
 * until it exists) and times all_reduce (sum, float32) at each size with the same rules as the Python
 * bench: 3 warm-ups, an iteration count sized from the fastest of 5 more to last about the budget
 * (agreed across ranks: max), then the median of the per-iteration times on rank 0. One JSON object per
 * line on stdout.
 *
 *   cc -O2 -I shm engine_bench.c $LSPAWN_ENGINE -Wl,-rpath,$(dirname $LSPAWN_ENGINE) -o engine_bench
 *   ./engine_bench N [budget_ms] [bytes ...]      (default sizes: 4 1024 16384)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"

static char g_dir[256];

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void key_path(const char* key, char* out, size_t cap, const char* suffix) {
  char clean[512];
  size_t i = 0;
  for (; key[i] && i + 1 < sizeof clean; ++i) clean[i] = (key[i] == '/') ? '_' : key[i];
  clean[i] = 0;
  snprintf(out, cap, "%s/%s%s", g_dir, clean, suffix);
}

static int file_set(void* ctx, const char* key, const void* value, size_t len, lspawn_engine_error* err) {
  char tmp[1024], path[1024];
  char sfx[32];
  snprintf(sfx, sizeof sfx, ".tmp%d", (int)getpid());
  key_path(key, tmp, sizeof tmp, sfx);
  key_path(key, path, sizeof path, "");
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0 || write(fd, value, len) != (ssize_t)len || close(fd) != 0 || rename(tmp, path) != 0) {
    err->kind = LSPAWN_ENGINE_SYSTEM;
    err->rank = -1;
    snprintf(err->message, sizeof err->message, "file_set %.900s: %s", path, strerror(errno));
    return -1;
  }
  (void)ctx;
  return 0;
}

static long file_get(void* ctx, const char* key, void* buf, size_t cap, lspawn_engine_error* err) {
  char path[1024];
  key_path(key, path, sizeof path, "");
  double deadline = now() + 60;
  for (;;) {
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
      ssize_t n = read(fd, buf, cap);
      close(fd);
      if (n >= 0) return (long)n;
    }
    if (now() > deadline) {
      err->kind = LSPAWN_ENGINE_TIMEOUT;
      err->rank = -1;
      snprintf(err->message, sizeof err->message, "file_get %.900s: still missing after 60 s", path);
      return -1;
    }
    usleep(1000);
  }
  (void)ctx;
}

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static void die(int rank, const char* what, lspawn_engine_error* err) {
  fprintf(stderr, "engine_bench rank %d: %s failed: %s\n", rank, what, err->message);
  _exit(1);
}

static int worker(int rank, int n, double budget, long* sizes, int nsizes, const char* label) {
  lspawn_engine_error err;
  memset(&err, 0, sizeof err);
  lspawn_engine* e = lspawn_engine_create(rank, n, label, 60000, NULL, file_set, file_get, NULL, &err);
  if (!e) die(rank, "lspawn_engine_create", &err);
  for (int s = 0; s < nsizes; ++s) {
    long count = sizes[s] / 4 > 0 ? sizes[s] / 4 : 1;
    float* buf = malloc(count * sizeof(float));
    for (long i = 0; i < count; ++i) buf[i] = (float)(rank + 1);
    for (int i = 0; i < 3; ++i)
      if (lspawn_engine_all_reduce(e, buf, count, LSPAWN_ENGINE_FLOAT32, LSPAWN_ENGINE_SUM, &err)) die(rank, "all_reduce", &err);
    if (lspawn_engine_barrier(e, &err)) die(rank, "barrier", &err);
    double fastest = 1e9;
    for (int i = 0; i < 5; ++i) {
      double t = now();
      if (lspawn_engine_all_reduce(e, buf, count, LSPAWN_ENGINE_FLOAT32, LSPAWN_ENGINE_SUM, &err)) die(rank, "all_reduce", &err);
      t = now() - t;
      if (t < fastest) fastest = t;
    }
    double it = budget / (fastest > 1e-7 ? fastest : 1e-7);
    if (it < 5) it = 5;
    if (it > 2000) it = 2000;
    double agreed = it;
    if (lspawn_engine_all_reduce(e, &agreed, 1, LSPAWN_ENGINE_FLOAT64, LSPAWN_ENGINE_MAX, &err)) die(rank, "all_reduce(max)", &err);
    long iters = (long)agreed;
    double* times = malloc(iters * sizeof(double));
    if (lspawn_engine_barrier(e, &err)) die(rank, "barrier", &err);
    for (long i = 0; i < iters; ++i) {
      double t = now();
      if (lspawn_engine_all_reduce(e, buf, count, LSPAWN_ENGINE_FLOAT32, LSPAWN_ENGINE_SUM, &err)) die(rank, "all_reduce", &err);
      times[i] = now() - t;
    }
    qsort(times, iters, sizeof(double), cmp);
    double median = iters % 2 ? times[iters / 2] : 0.5 * (times[iters / 2 - 1] + times[iters / 2]);
    if (rank == 0) {
      printf("{\"impl\": \"engine\", \"op\": \"all_reduce\", \"nprocs\": %d, \"bytes\": %ld, \"iters\": %ld, "
             "\"median_us\": %.3f}\n", n, count * 4, iters, median * 1e6);
      fflush(stdout);
    }
    free(times);
    free(buf);
  }
  lspawn_engine_destroy(e);
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s N [budget_ms] [bytes ...]\n", argv[0]);
    return 2;
  }
  int n = atoi(argv[1]);
  double budget = (argc > 2 ? atof(argv[2]) : 300.0) / 1e3;
  long sizes[64] = {4, 1024, 16384};
  int nsizes = 3;
  if (argc > 3) {
    nsizes = 0;
    for (int i = 3; i < argc && nsizes < 64; ++i) sizes[nsizes++] = atol(argv[i]);
  }
  if (lspawn_engine_abi() != LSPAWN_ENGINE_ABI) {
    fprintf(stderr, "engine_bench: engine ABI %d, header %d\n", lspawn_engine_abi(), LSPAWN_ENGINE_ABI);
    return 2;
  }
  snprintf(g_dir, sizeof g_dir, "/tmp/lspawn-engbench.XXXXXX");
  if (!mkdtemp(g_dir)) {
    perror("mkdtemp");
    return 2;
  }
  char label[64];
  snprintf(label, sizeof label, "engbench-%d-%d", (int)getpid(), n);
  pid_t pids[256];
  for (int r = 0; r < n; ++r) {
    pids[r] = fork();
    if (pids[r] == 0) _exit(worker(r, n, budget, sizes, nsizes, label));
  }
  int rc = 0;
  for (int r = 0; r < n; ++r) {
    int st;
    waitpid(pids[r], &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) rc = 1;
  }
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  if (system(cmd)) {}
  return rc;
}
