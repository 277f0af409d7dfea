// liblspawn_preload.so: the fork loop for an interpreter (`lspawn --preload`, docs/cli.md).
//
// The C++ forkserver hook (forkserver_hook.hpp) runs the fork loop from a static constructor; a
// Python program has no such place, and its interpreter must be told about each fork. So the
// same steps are a shared library (no LibTorch, no libpython: the interpreter hands in its own
// functions) that python/lspawn_preload.py loads with ctypes.PyDLL (the GIL stays held) once
// the preloaded modules are imported:
//
//   lspawn ──exec──► python3 lspawn_preload.py --lib liblspawn_preload.so --modules torch,...
//                      imports the modules, checks threads and CUDA, then either
//                      lspawn_preload_refuse(why)      lspawn reports why, the server exits 1
//                      lspawn_preload_serve(hooks)     ready; fork_loop::serve() — returns 0 in
//                                                      each worker, which runs the script
//
// The protocol, the workers' set-up (process group, PR_SET_PDEATHSIG, stdio, environment, cwd,
// umask) and the per-run servers of the warm daemon are fork_loop.hpp's, unchanged.
//
// Every function is extern "C", never throws, and reports a failure as -1 with a message in
// err[0..err_len) (NUL-terminated) for the caller to print.
#pragma once

#include <stddef.h>

extern "C" {

// Threads of the calling process (entries of /proc/self/task; -1 when unreadable): the
// interpreter's threading module cannot see threads a C extension started.
int lspawn_preload_threads(void);

// Threads left after one fork() (of a child that _exits at once): a library that stops its own
// threads in a pthread_atfork prepare handler (OpenBLAS's pool, which numpy and Debian's torch
// start at import) is fork-safe, and its threads are gone then (it starts them again when used).
// -1 when fork() fails or /proc is unreadable.
int lspawn_preload_threads_after_fork(void);

// Refuses to serve: tells the lspawn that executed this process `why` (it prints it and starts
// no worker). Then the caller exits. -1 when not started by lspawn (LSPAWN_FORKSERVER_FDS unset
// or bad) or lspawn is gone.
int lspawn_preload_refuse(const char* why, char* err, size_t err_len);

// Says ready and serves fork requests (fork_loop::serve, owner: the parent process), calling
// `before` / `parent` / `child` around each fork (fork_loop::ForkHooks: PyOS_BeforeFork,
// PyOS_AfterFork_Parent, PyOS_AfterFork_Child). Never returns in the server. Returns 0 in each
// forked worker, set up as fork_loop.hpp says (C environment replaced by the request's). -1
// when not started by lspawn or lspawn is gone before the loop starts.
int lspawn_preload_serve(void (*before)(void), void (*parent)(void), void (*child)(void), char* err, size_t err_len);

}  // extern "C"
