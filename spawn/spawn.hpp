// lspawn::spawn(): start `nprocs` workers running fn(index, args...), in the manner of
// torch.multiprocessing.spawn and torch_xla's xmp.spawn. Public entry: <lspawn/spawn.hpp>.
//
//   void train(int index, int epochs, std::string name);   // the index comes first
//   LSPAWN_REGISTER(train);             // needed by Spawn and Forkserver (found by name)
//   int main(int argc, char** argv) {
//     lspawn::init(argc, argv);         // in a worker started by exec: runs train and exits
//     lspawn::SpawnOptions o;
//     o.nprocs = 4;
//     o.start_method = lspawn::StartMethod::Spawn;
//     lspawn::spawn(train, std::make_tuple(10, std::string("run")), o);
//   }
//
// Arguments: converted to fn's parameter types, then (for Spawn and Forkserver) encoded with
// lspawn::Codec. A parameter type without a Codec is a compile-time error, whatever the start
// method. Each worker gets the env contract of the lspawn CLI (RANK, LOCAL_RANK, WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT reserved for the run, TORCHELASTIC_ERROR_FILE, LSPAWN_RUN_DIR, ...),
// so lspawn::init_process_group() works inside fn.
//
// Results: fn may return a value of any type with a Codec. spawn() returns a ProcessContext;
// once joined, ctx.results<R>() holds one std::optional<R> per index (nullopt for ranks not
// asked, see SpawnOptions::results). It is how a DDP-spawn strategy gets the trained state back.
//
// Failure: the first failing worker stops the others (SIGTERM to their process groups, SIGKILL
// after the grace period) and spawn() (or join()) throws ProcessRaisedException ("process 1
// terminated with the following error: std::runtime_error: boom") or ProcessExitedException
// ("process 1 terminated with exit code 3", "process 0 terminated with signal SIGABRT").
// Invalid options and start failures throw SpawnError before anything is left running.
#pragma once

#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#include "spawn/codec.hpp"
#include "spawn/errors.hpp"
#include "spawn/init.hpp"
#include "spawn/options.hpp"
#include "spawn/process_context.hpp"
#include "spawn/registry.hpp"

namespace lspawn {

namespace spawn_detail {
// Parameter types after the index, and whether fn is a plain function (can be registered).
template <class Fn, class... A>
struct Signature {
  using Params = std::tuple<std::decay_t<A>...>;
  static constexpr bool kFunctionPointer = false;
};
template <class R, class I, class... P, class... A>
struct Signature<R (*)(I, P...), A...> {
  using Params = std::tuple<std::decay_t<P>...>;
  static constexpr bool kFunctionPointer = true;
};

template <class T>
struct AllHaveCodecs;
template <class... T>
struct AllHaveCodecs<std::tuple<T...>> : std::bool_constant<(has_codec<T>::value && ...)> {};

// Validates SpawnOptions::nprocs (unset: local accelerators or 1). Throws SpawnError.
int resolve_nprocs(const SpawnOptions& opts);

template <class Fn, class Params>
auto invoke_with_index(Fn& fn, int index, Params& params) {
  return std::apply([&](auto&... p) { return fn(index, p...); }, params);
}

template <class R, class Fn, class Params>
std::optional<proto::Value> call_encoded(Fn& fn, int index, Params& params) {
  if constexpr (std::is_void_v<R>) {
    invoke_with_index(fn, index, params);
    return std::nullopt;
  } else {
    return Codec<std::decay_t<R>>::encode(invoke_with_index(fn, index, params));
  }
}
}  // namespace spawn_detail

template <class Fn, class... A>
ProcessContext spawn(Fn fn, std::tuple<A...> args, const SpawnOptions& opts = {}) {
  using Sig = spawn_detail::Signature<Fn, A...>;
  using Params = typename Sig::Params;
  static_assert(spawn_detail::AllHaveCodecs<Params>::value,
                "every spawn() argument type needs an lspawn::Codec (see spawn/codec.hpp)");
  static_assert(std::is_constructible_v<Params, std::tuple<A...>&&>,
                "spawn(): the arguments do not convert to the function's parameter types");
  using R = decltype(spawn_detail::invoke_with_index(fn, 0, std::declval<Params&>()));
  static_assert(std::is_void_v<R> || has_codec<std::decay_t<R>>::value,
                "the value returned by a spawn() function needs an lspawn::Codec");

  const int nprocs = spawn_detail::resolve_nprocs(opts);
  auto params = std::make_shared<Params>(std::move(args));
  if (nprocs == 1) {  // no child: exceptions propagate as they are
    std::optional<proto::Value> value = spawn_detail::call_encoded<R>(fn, 0, *params);
    std::vector<std::optional<proto::Value>> results(1);
    if (opts.results != ResultFrom::None) results[0] = std::move(value);
    return ProcessContext::in_process(std::move(results));
  }
  SpawnPlan plan;
  plan.nprocs = nprocs;
  if constexpr (Sig::kFunctionPointer) {
    if (auto name = FunctionRegistry::global().name_of(reinterpret_cast<FunctionAddress>(fn))) {
      plan.function = *name;
    }
  }
  plan.arguments = params;
  plan.encode_args = [params] { return encode_args(*params); };
  plan.run_in_child = [fn, params](int index) mutable { return spawn_detail::call_encoded<R>(fn, index, *params); };
  ProcessContext ctx(plan, opts);
  if (opts.join) ctx.join();
  return ctx;
}

// spawn() of a function that takes only the index.
template <class Fn>
ProcessContext spawn(Fn fn, const SpawnOptions& opts = {}) {
  return spawn(std::move(fn), std::tuple<>(), opts);
}

}  // namespace lspawn
