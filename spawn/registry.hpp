// FunctionRegistry: the names under which spawn() finds a function in a freshly exec'd child.
//
// A child started by StartMethod::Spawn (exec of the same binary) or by the forkserver receives
// a SpawnCall naming the function; LSPAWN_REGISTER(fn) at namespace scope makes `fn` findable by
// the name "fn" (the text of the macro argument) and by its address, so spawn(fn, ...) in the
// parent can name it to the child. A function must be registered for every start method but
// Fork; spawn() throws SpawnError naming LSPAWN_REGISTER when it is not.
//
// A registered function is `R fn(Index index, P... args)`: the index comes first (as in
// xmp.spawn), Index is an integral type, each P (after decay) and R (unless void) must have a
// Codec (spawn/codec.hpp): an unsupported type fails to compile at LSPAWN_REGISTER.
//
// The registry is the one process-wide table in lspawn, filled during static initialisation
// (before main) and read-only afterwards; it is therefore safe to read from any thread.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "spawn/codec.hpp"
#include "proto/messages.hpp"

namespace lspawn {

// Decodes the arguments, calls the function with (index, args...) and returns its encoded
// result (nullopt for void functions). Throws CodecError when the arguments do not decode as
// the function's parameter types, and whatever the function throws.
using Invoker = std::function<std::optional<proto::Value>(int index, const proto::ValueList& args)>;

// A function pointer erased to one comparable type (identity only; never called through).
using FunctionAddress = void (*)();

namespace registry_detail {
void check_arity(const proto::ValueList& args, size_t expected);

template <class... P, class F, size_t... I>
std::optional<proto::Value> decode_and_call(F& call, const proto::ValueList& args, std::index_sequence<I...>) {
  // Braced init decodes left to right, so the first bad argument is the one reported.
  std::tuple<std::decay_t<P>...> decoded{Codec<std::decay_t<P>>::decode(args[I])...};
  return std::apply(call, std::move(decoded));
}
}  // namespace registry_detail

// Type-erases `fn` into an Invoker. Compile-time checks every parameter and the result type.
template <class Index, class R, class... P>
Invoker make_invoker(R (*fn)(Index, P...)) {
  static_assert(std::is_integral_v<std::decay_t<Index>>,
                "a spawn() function takes its process index (an integer) as first parameter");
  static_assert((has_codec<std::decay_t<P>>::value && ...),
                "every parameter of a spawn() function after the index needs an lspawn::Codec");
  static_assert(std::is_void_v<R> || has_codec<std::decay_t<R>>::value,
                "the result type of a spawn() function needs an lspawn::Codec (or be void)");
  return [fn](int index, const proto::ValueList& args) -> std::optional<proto::Value> {
    registry_detail::check_arity(args, sizeof...(P));
    auto call = [&](auto... decoded) {
      if constexpr (std::is_void_v<R>) {
        fn(static_cast<Index>(index), std::move(decoded)...);
        return std::optional<proto::Value>();
      } else {
        return std::optional<proto::Value>(
            Codec<std::decay_t<R>>::encode(fn(static_cast<Index>(index), std::move(decoded)...)));
      }
    };
    return registry_detail::decode_and_call<P...>(call, args, std::index_sequence_for<P...>{});
  };
}

class FunctionRegistry {
 public:
  // The process-wide registry that LSPAWN_REGISTER fills.
  static FunctionRegistry& global();

  // Adds `name`. Throws std::logic_error if the name is already taken by another function.
  void add(const std::string& name, FunctionAddress address, Invoker invoker);

  // The invoker registered under `name`, or nullptr.
  const Invoker* find(const std::string& name) const;

  // The name `address` was registered under, or nullopt.
  std::optional<std::string> name_of(FunctionAddress address) const;

  // Every registered name, sorted (for error messages).
  std::string names() const;

 private:
  struct Entry {
    FunctionAddress address;
    Invoker invoker;
  };
  std::map<std::string, Entry> by_name_;
};

// Performs one registration at static-initialisation time (what LSPAWN_REGISTER expands to).
struct Registration {
  template <class Index, class R, class... P>
  Registration(const char* name, R (*fn)(Index, P...)) {
    FunctionRegistry::global().add(name, reinterpret_cast<FunctionAddress>(fn), make_invoker(fn));
  }
};

}  // namespace lspawn

#define LSPAWN_DETAIL_CAT2(a, b) a##b
#define LSPAWN_DETAIL_CAT(a, b) LSPAWN_DETAIL_CAT2(a, b)
// Registers a function for spawn() under its own name. Use once, at namespace scope, in the
// program that calls spawn() (not in a header included twice): LSPAWN_REGISTER(train);
#define LSPAWN_REGISTER(fn) \
  static const ::lspawn::Registration LSPAWN_DETAIL_CAT(lspawn_registration_, __LINE__)(#fn, &fn)
