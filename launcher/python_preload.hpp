// `lspawn --preload MODULE[,MODULE...] python3 SCRIPT|-m MODULE [ARGS...]` (docs/cli.md): a
// Python job whose interpreter and preloaded modules (torch: ~3 s per process) are loaded once
// per node, its workers forked from it.
//
// The CLI runs it as a forkserver (the same ForkedWorkers + Supervisor path as a C++ program's
// --start-method forkserver, and the warm daemon's for --warm): the program it executes once is
//   PYTHON <python dir>/lspawn_preload.py --lib <liblspawn_preload.so> --modules M1,M2
// (the server: python/lspawn_preload.py, spawn/python_preload_entry.hpp), which knows
// nothing of the script: each worker gets the script (or -m module) and its arguments in
// LSPAWN_PRELOAD_ARGV of its own environment, so one warm server serves any script of the
// same interpreter, modules and environment.
#pragma once

#include <string>
#include <vector>

namespace lspawn::preload {

// A worker's script and arguments (sys.argv; "-m", MODULE, ARGS... for a module): a JSON array
// of strings, read and removed from os.environ by the worker before the script runs.
inline constexpr const char* kArgvEnv = "LSPAWN_PRELOAD_ARGV";

// Why `name` cannot be a --preload module ("" when it can): a dotted Python name.
std::string check_module(const std::string& name);

// Whether `path` names a Python interpreter (its basename starts with "python"): the rule of
// --preload's program and of the Python workers' sitecustomize (python_site.hpp).
bool is_python_interpreter(const std::string& path);

// Why `program` (lspawn's program and its arguments) cannot run with --preload ("" when it
// can): argv[0] must name a Python interpreter (basename python*), followed by a script or
// -m MODULE; other interpreter options are refused (the server is one interpreter for all).
std::string check_program(const std::vector<std::string>& program);

// The server's files: lspawn_preload.py and liblspawn_preload.so, found beside the binary
// (supervisor/install_layout.hpp). Throws std::runtime_error naming each missing file and where
// it looked.
struct Files {
  std::string bootstrap;
  std::string library;
};
Files locate();

// The server's argv: program[0], the bootstrap, --lib, --modules.
std::vector<std::string> server_argv(const std::vector<std::string>& program, const std::vector<std::string>& modules,
                                     const Files& files);

// The value of kArgvEnv for `program` (program[1..]).
std::string worker_argv(const std::vector<std::string>& program);

}  // namespace lspawn::preload
