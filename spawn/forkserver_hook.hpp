// The forkserver hook: what lets `lspawn --start-method forkserver` start a program's workers
// by fork() from one exec of it, instead of one exec per worker.
//
// Linking the hook into a program (lspawn_runtime links it; a plain program links
// lspawn::forkserver_hook) adds a static constructor and an ELF section named
// kForkserverNoteSection (how lspawn tells, before it starts anything, that the program can be
// a forkserver). The constructor does nothing unless LSPAWN_FORKSERVER_FDS is set, which only
// Forkserver::exec() does. Then, after the dynamic loader and every shared library's static
// initialisation ran (LibTorch's costs ~0.5 s of CPU per process), the constructor unsets the
// variable, tells lspawn it is ready (or refuses when threads already run: forking them is
// unsafe) and becomes the server of fork_loop.hpp. Each worker it forks returns from the
// constructor with its own environment (RANK, ...), stdout/stderr and process group, and runs
// the rest of the program's static initialisation and main() as an exec'd worker would.
//
// What differs from an exec'd worker: its parent is the forkserver (not lspawn), /proc/self
// shows the same argv, static initialisers of shared libraries saw the forkserver's
// environment (the variables common to every worker; not RANK, LOCAL_RANK or the error file),
// and at exit (return from main, exit()) the destructors of the program's own static objects
// and of function-local statics run, then stdio and iostreams are flushed and the worker
// _exits: the shared libraries' static objects, built once in the forkserver, are not
// destroyed (LibTorch's take ~0.2 s of CPU per process), as multiprocessing's forked children
// skip them. LSPAWN_FORKSERVER_FAST_EXIT=0 keeps the full exit; so do ASan builds.
#pragma once

namespace lspawn {

// Set to "0" in lspawn's environment: forked workers run every static destructor at exit.
inline constexpr const char* kForkserverFastExitEnv = "LSPAWN_FORKSERVER_FAST_EXIT";

// Name of the ELF section that marks a program linking the hook.
inline constexpr const char* kForkserverNoteSection = ".note.lspawn.forkserver";

}  // namespace lspawn

// Defined by the hook; referenced (-u) so that linking the static library keeps it.
extern "C" int lspawn_forkserver_hook_anchor;
