#include "runtime/throw_trace.hpp"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <typeinfo>

#include <ctime>

#include <cxxabi.h>
#include <dlfcn.h>
#include <execinfo.h>

namespace lspawn::detail {
namespace {

constexpr int kMaxFrames = 64;

struct LastThrow {
  const void* object = nullptr;  // the thrown object (what std::exception_ptr points to)
  int64_t time_us = 0;           // CLOCK_REALTIME at the throw
  int n = 0;
  void* frames[kMaxFrames];
};

thread_local LastThrow t_last_throw;

bool capture_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("LSPAWN_THROW_TRACE");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return enabled;
}

// libstdc++'s std::exception_ptr is exactly a pointer to the thrown object.
const void* object_of(const std::exception_ptr& e) {
  static_assert(sizeof(std::exception_ptr) == sizeof(void*), "libstdc++ exception_ptr layout");
  const void* p;
  std::memcpy(&p, &e, sizeof p);
  return p;
}

}  // namespace

std::string demangle(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  return (status == 0 && out) ? std::string(out.get()) : std::string(mangled);
}

std::string symbolize(void* const* frames, int n, int skip) {
  std::unique_ptr<char*, void (*)(void*)> symbols(::backtrace_symbols(frames, n), std::free);
  std::string out;
  for (int i = skip; i < n; ++i) {
    std::string line = symbols ? symbols.get()[i] : "?";
    // "binary(mangled+0x1f) [0xaddr]" → "binary(demangled+0x1f) [0xaddr]"
    const auto open = line.find('(');
    const auto plus = open == std::string::npos ? std::string::npos : line.find('+', open);
    if (plus != std::string::npos && plus > open + 1) {
      const std::string mangled = line.substr(open + 1, plus - open - 1);
      line = line.substr(0, open + 1) + demangle(mangled.c_str()) + line.substr(plus);
    }
    out += "#" + std::to_string(i - skip) + " " + line + "\n";
  }
  return out;
}

std::string throw_site_backtrace(const std::exception_ptr& error) {
  const LastThrow& t = t_last_throw;
  if (!error || t.n == 0 || t.object != object_of(error)) return "";
  return symbolize(t.frames, t.n, 1);  // frame 0 is __cxa_throw below
}

int64_t throw_site_time_us(const std::exception_ptr& error) {
  const LastThrow& t = t_last_throw;
  if (!error || t.object != object_of(error)) return 0;
  return t.time_us;
}

}  // namespace lspawn::detail

namespace __cxxabiv1 {  // where <cxxabi.h> declares it (extern "C": the name is plain __cxa_throw)

using CxaThrow = void (*)(void*, std::type_info*, void (*)(void*));

// Interposes the C++ runtime's __cxa_throw for the whole process (the executable exports it to
// the shared libraries that throw, LibTorch included) and forwards to the next definition.
extern "C" void __cxa_throw(void* object, std::type_info* type, void (*destroy)(void*)) {
  static const CxaThrow next = reinterpret_cast<CxaThrow>(::dlsym(RTLD_NEXT, "__cxa_throw"));
  if (lspawn::detail::capture_enabled()) {
    lspawn::detail::LastThrow& t = lspawn::detail::t_last_throw;
    t.object = object;
    struct timespec now;
    ::clock_gettime(CLOCK_REALTIME, &now);
    t.time_us = int64_t(now.tv_sec) * 1000000 + now.tv_nsec / 1000;
    t.n = ::backtrace(t.frames, lspawn::detail::kMaxFrames);
  }
  if (next == nullptr) std::abort();  // no C++ runtime after us: cannot happen with libstdc++
  next(object, type, destroy);
  __builtin_unreachable();
}

}  // namespace __cxxabiv1
