// Throw-site stacks: lspawn_runtime defines __cxa_throw (forwarding to the C++ runtime's) and
// keeps, per thread, the raw stack of the last exception thrown. The error report of an exception
// caught by lspawn::run_main/record can then show where it was thrown, not only where it was
// caught. Cost: one backtrace() (a few microseconds) per throw; LSPAWN_THROW_TRACE=0 turns the
// capture off. Internal to runtime/ (error_report.cpp).
#pragma once

#include <cstdint>
#include <exception>
#include <string>

namespace lspawn::detail {

// The symbolized stack of the throw of `error` when this thread recorded it (the last throw on
// this thread was that very exception object), else "".
std::string throw_site_backtrace(const std::exception_ptr& error);

// Wall-clock time (µs since the epoch) of the throw of `error` when this thread recorded it,
// else 0. The error report's failed_at_us: when the failure happened, before any unwinding.
int64_t throw_site_time_us(const std::exception_ptr& error);

// A C++ type name demangled (abi::__cxa_demangle), or `mangled` itself when it is not one.
std::string demangle(const char* mangled);

// Frames as "#i binary(symbol+off) [addr]" lines, demangled; skips the first `skip`.
std::string symbolize(void* const* frames, int n, int skip);

}  // namespace lspawn::detail
