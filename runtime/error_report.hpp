// Error reports: a worker that dies of an uncaught exception says why, in a file the launcher
// reads (proto ErrorReport as JSON, docs/error-reports.md) and on stderr:
//
//   [lspawn] rank 1: uncaught std::runtime_error: bad batch
//
// Where the report goes: TORCHELASTIC_ERROR_FILE, else LSPAWN_ERROR_FILE; with neither set only
// the stderr line is printed. Rank and local rank come from RANK / LOCAL_RANK (-1 when unset
// or malformed: reporting never throws because of the environment).
//
// Two ways to use it, both safe to combine:
//   int main(int argc, char** argv) { return lspawn::run_main(argc, argv, real_main); }
//     catches what real_main throws, reports it and returns 1 (library code never calls exit()).
//   lspawn::install_error_handler();
//     a std::terminate handler for exceptions that escape anywhere else (other threads,
//     noexcept functions): reports the exception, with the backtrace of the throw site, then
//     calls std::abort() (the process dies of SIGABRT, as it would without the handler).
#pragma once

#include <exception>
#include <functional>
#include <string>

#include "proto/messages.hpp"

namespace lspawn {

// Builds the report of `error` (an exception_ptr, typically std::current_exception()).
// `backtrace` is used when the exception carries none of its own (c10::Error does).
proto::ErrorReport make_error_report(std::exception_ptr error, const std::string& backtrace = {});

// Writes the report of `error` to the error file named by the environment, if any, and prints
// the "[lspawn] rank N: uncaught <type>: <what>" line to stderr. Returns the path written, or ""
// when no error file is set or writing failed (the reason is printed). Never throws.
std::string write_error_report(const std::exception& error);
std::string write_error_report(std::exception_ptr error);

// Installs the std::terminate handler described above. Idempotent; returns the previous handler.
std::terminate_handler install_error_handler();

// Calls fn(); if it throws, writes the error report and returns 1, else returns fn's result.
int record(const std::function<int()>& fn);

// install_error_handler(), then record(main_fn(argc, argv)).
int run_main(int argc, char** argv, int (*main_fn)(int, char**));

// The current call stack, one frame per line, demangled where possible; skips `skip` frames.
std::string current_backtrace(int skip = 0);

}  // namespace lspawn
