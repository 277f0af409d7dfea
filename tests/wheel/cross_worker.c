/* A worker for tests/wheel/cross.sh, cross-compiled with zig for the wheel's architecture (aarch64
 * under qemu-user): a program of that architecture for the wheel's launcher to start, where no
 * Python of it is at hand. One mode per check:
 *   cross_worker rank                     prints "rank R of W on <arch>" (RANK, WORLD_SIZE)
 *   cross_worker fail CODE                rank 1 exits CODE; the others wait to be stopped
 *   cross_worker sleep DIR                forks a child; each writes its pid (DIR/pid.R,
 *                                         DIR/child.R), then waits to be killed (the child, which
 *                                         no PR_SET_PDEATHSIG reaches, by the guardian alone)
 *   cross_worker all_reduce ENGINE DIR LABEL
 *                                         loads the wheel's liblspawn_engine.so (ENGINE) and sums
 *                                         [R+1]*N over the ranks (float32, int64) through it, the
 *                                         segment's name passed through files in DIR; prints
 *                                         "rank R: all_reduce sum S on shm"
 *   cross_worker preload LIB              loads the wheel's liblspawn_preload.so (LIB) and counts
 *                                         this process's threads through it, then after a fork;
 *                                         prints "rank R: preload library: T threads, T after fork"
 * Exits 2 naming what was wrong on bad use, 1 when a check fails. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../shm/engine.h"

#if defined(__aarch64__)
#define ARCH "aarch64"
#elif defined(__x86_64__)
#define ARCH "x86_64"
#else
#define ARCH "another architecture"
#endif

static int env_int(const char* name) {
  const char* v = getenv(name);
  if (!v) {
    fprintf(stderr, "cross_worker: %s is not set (run it under lspawn)\n", name);
    exit(2);
  }
  return atoi(v);
}

static void wait_to_be_stopped(void) {
  for (;;) pause();
}

/* The engine's rendezvous store: one file per key in a folder, written whole by rename(2). */
static int store_set(void* ctx, const char* key, const void* value, size_t len, lspawn_engine_error* err) {
  char path[4096], tmp[4200];
  snprintf(path, sizeof path, "%s/%s", (const char*)ctx, key);
  snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
  FILE* f = fopen(tmp, "wb");
  if (!f || fwrite(value, 1, len, f) != len || fclose(f) != 0 || rename(tmp, path) != 0) {
    snprintf(err->message, sizeof err->message, "store set %s: %s", path, strerror(errno));
    err->kind = LSPAWN_ENGINE_SYSTEM;
    return -1;
  }
  return 0;
}

static long store_get(void* ctx, const char* key, void* buf, size_t cap, lspawn_engine_error* err) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", (const char*)ctx, key);
  for (int waited_ms = 0; waited_ms < 60000; waited_ms += 5) {
    FILE* f = fopen(path, "rb");
    if (f) {
      const size_t n = fread(buf, 1, cap, f);
      fclose(f);
      return (long)n;
    }
    const struct timespec five_ms = {0, 5000000};
    nanosleep(&five_ms, NULL);
  }
  snprintf(err->message, sizeof err->message, "store get %s: not there after 60 s", path);
  err->kind = LSPAWN_ENGINE_TIMEOUT;
  return -1;
}

#define LOAD(var, name)                                                        \
  var = dlsym(lib, name);                                                      \
  if (!var) {                                                                  \
    fprintf(stderr, "cross_worker: %s: no symbol %s\n", argv[2], name);        \
    return 1;                                                                  \
  }

static int all_reduce(int argc, char** argv, int rank, int world) {
  if (argc != 5) {
    fprintf(stderr, "cross_worker: all_reduce ENGINE DIR LABEL: %d arguments given\n", argc - 2);
    return 2;
  }
  void* lib = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "cross_worker: dlopen: %s\n", dlerror());
    return 1;
  }
  lspawn_engine* (*create)(int, int, const char*, int64_t, const int*, lspawn_engine_set_fn, lspawn_engine_get_fn,
                           void*, lspawn_engine_error*);
  int (*reduce)(lspawn_engine*, void*, size_t, int, int, lspawn_engine_error*);
  void (*destroy)(lspawn_engine*);
  LOAD(create, "lspawn_engine_create");
  LOAD(reduce, "lspawn_engine_all_reduce");
  LOAD(destroy, "lspawn_engine_destroy");
  lspawn_engine_error err = {0, -1, ""};
  lspawn_engine* engine = create(rank, world, argv[4], 60000, NULL, store_set, store_get, argv[3], &err);
  if (!engine) {
    fprintf(stderr, "cross_worker: rank %d: lspawn_engine_create: %s\n", rank, err.message);
    return 1;
  }
  enum { N = 1 << 16 };
  static float f[N];
  static long long l[N];
  for (int i = 0; i < N; ++i) {
    f[i] = (float)(rank + 1);
    l[i] = rank + 1;
  }
  if (reduce(engine, f, N, LSPAWN_ENGINE_FLOAT32, LSPAWN_ENGINE_SUM, &err) != 0 ||
      reduce(engine, l, N, LSPAWN_ENGINE_INT64, LSPAWN_ENGINE_SUM, &err) != 0) {
    fprintf(stderr, "cross_worker: rank %d: lspawn_engine_all_reduce: %s\n", rank, err.message);
    return 1;
  }
  const long long want = (long long)world * (world + 1) / 2;
  for (int i = 0; i < N; ++i) {
    if (f[i] != (float)want || l[i] != want) {
      fprintf(stderr, "cross_worker: rank %d: element %d is %g / %lld, expected %lld\n", rank, i, f[i], l[i], want);
      return 1;
    }
  }
  destroy(engine);
  printf("rank %d: all_reduce sum %lld on shm\n", rank, want);
  return 0;
}

/* No aarch64 Python here to run --preload's server: its library is loaded and called alone. */
static int preload(int argc, char** argv, int rank) {
  if (argc != 3) {
    fprintf(stderr, "cross_worker: preload LIB: %d arguments given\n", argc - 2);
    return 2;
  }
  void* lib = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "cross_worker: dlopen: %s\n", dlerror());
    return 1;
  }
  int (*threads)(void);
  int (*threads_after_fork)(void);
  LOAD(threads, "lspawn_preload_threads");
  LOAD(threads_after_fork, "lspawn_preload_threads_after_fork");
  const int now = threads(), after = threads_after_fork();
  if (now < 1 || after < 1) {
    fprintf(stderr, "cross_worker: rank %d: lspawn_preload_threads %d, after fork %d: expected >= 1\n", rank, now, after);
    return 1;
  }
  printf("rank %d: preload library: %d threads, %d after fork\n", rank, now, after);
  return 0;
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "";
  const int rank = env_int("RANK"), world = env_int("WORLD_SIZE");
  if (strcmp(mode, "rank") == 0) {
    printf("rank %d of %d on %s\n", rank, world, ARCH);
    return 0;
  }
  if (strcmp(mode, "fail") == 0 && argc == 3) {
    if (rank == 1) return atoi(argv[2]);
    wait_to_be_stopped();
  }
  if (strcmp(mode, "sleep") == 0 && argc == 3) {
    const pid_t child = fork();
    if (child < 0) {
      fprintf(stderr, "cross_worker: fork: %s\n", strerror(errno));
      return 1;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.%d", argv[2], child == 0 ? "child" : "pid", rank);
    FILE* f = fopen(path, "w");
    if (!f || fprintf(f, "%d\n", (int)getpid()) < 0 || fclose(f) != 0) {
      fprintf(stderr, "cross_worker: %s: %s\n", path, strerror(errno));
      return 1;
    }
    wait_to_be_stopped();
  }
  if (strcmp(mode, "all_reduce") == 0) return all_reduce(argc, argv, rank, world);
  if (strcmp(mode, "preload") == 0) return preload(argc, argv, rank);
  fprintf(stderr, "cross_worker: unknown use '%s' (rank, fail CODE, sleep DIR, all_reduce ENGINE DIR LABEL, preload LIB)\n", mode);
  return 2;
}
