// lspawn::Codec<T>: how a value of type T crosses a process boundary as a proto::Value.
//
// spawn() encodes every argument with Codec<std::decay_t<Arg>>::encode in the parent and the
// child decodes it with Codec<Param>::decode, whatever the start method (under Fork the values
// are not encoded, but the check still happens at compile time so that switching the start
// method never turns into a run-time surprise). Function results travel the same way.
//
// Supported here (torch-free): bool, every integral type (range-checked on decode), float and
// double, std::string, std::vector<T>, std::pair<A, B>, std::tuple<T...>, std::optional<T>,
// std::map<std::string, T>, and enums (as their underlying integer). Tensors: include
// <lspawn/tensor_codec.hpp> (runtime/spawn). Any other type fails to compile with a
// static_assert naming lspawn::Codec; a user adds a type by specialising Codec<T> with
//   static proto::Value encode(const T&);  static T decode(const proto::Value&);
//
// decode() throws CodecError naming the expected and the actual kind of value; it never trusts a
// size or a kind from the wire.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "proto/messages.hpp"
#include "proto/error.hpp"

namespace lspawn {

// A value that does not decode as the type the receiving function expects.
class CodecError : public lspawn::Error {
 public:
  using lspawn::Error::Error;
};

namespace codec_detail {
template <class T>
inline constexpr bool kAlwaysFalse = false;
[[noreturn]] void throw_kind_mismatch(const char* expected, const proto::Value& got);
[[noreturn]] void throw_out_of_range(const char* type, const std::string& value);
void expect_list_size(const proto::Value& v, size_t expected, const char* what);
}  // namespace codec_detail

// Primary template: reached only by types with no codec. Its members are templates so that
// merely naming Codec<T> (has_codec<T>) is fine; using them fails with the message below.
template <class T, class Enable = void>
struct Codec {
  template <class U = T>
  static proto::Value encode(const U&) {
    static_assert(codec_detail::kAlwaysFalse<U>,
                  "lspawn::Codec<T> is not defined for this spawn() argument/result type. "
                  "Supported: bool, integers, float, double, std::string, std::vector, "
                  "std::pair, std::tuple, std::optional, std::map<std::string, T>, enums, and "
                  "at::Tensor (include <lspawn/tensor_codec.hpp>). Specialise lspawn::Codec<T> "
                  "for your type.");
    return {};
  }
  template <class U = T>
  static U decode(const proto::Value&) {
    static_assert(codec_detail::kAlwaysFalse<U>,
                  "lspawn::Codec<T> is not defined for this spawn() argument/result type.");
  }
};

// True when Codec<T> is a supported (non-primary) specialisation; usable in static_asserts.
template <class T, class = void>
struct has_codec : std::false_type {};
template <class T>
struct has_codec<T, std::void_t<typename Codec<T>::is_lspawn_codec>> : std::true_type {};

template <>
struct Codec<bool> {
  using is_lspawn_codec = void;
  static proto::Value encode(bool b) { return proto::Value::of_bool(b); }
  static bool decode(const proto::Value& v) {
    if (v.kind != proto::Value::Kind::kBool) codec_detail::throw_kind_mismatch("bool", v);
    return v.b;
  }
};

template <class T>
struct Codec<T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>>> {
  using is_lspawn_codec = void;
  static proto::Value encode(T x) {
    if constexpr (std::is_unsigned_v<T> && sizeof(T) >= sizeof(int64_t)) {
      if (x > static_cast<T>(std::numeric_limits<int64_t>::max())) {
        codec_detail::throw_out_of_range("int64", std::to_string(x));
      }
    }
    return proto::Value::of_int(static_cast<int64_t>(x));
  }
  static T decode(const proto::Value& v) {
    if (v.kind != proto::Value::Kind::kInt) codec_detail::throw_kind_mismatch("int64", v);
    const int64_t i = v.i;
    if constexpr (std::is_signed_v<T>) {
      if (i < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
          i > static_cast<int64_t>(std::numeric_limits<T>::max())) {
        codec_detail::throw_out_of_range("a narrower integer", std::to_string(i));
      }
    } else {
      if (i < 0 || static_cast<uint64_t>(i) > std::numeric_limits<T>::max()) {
        codec_detail::throw_out_of_range("an unsigned integer", std::to_string(i));
      }
    }
    return static_cast<T>(i);
  }
};

template <class T>
struct Codec<T, std::enable_if_t<std::is_enum_v<T>>> {
  using is_lspawn_codec = void;
  using U = std::underlying_type_t<T>;
  static proto::Value encode(T x) { return Codec<U>::encode(static_cast<U>(x)); }
  static T decode(const proto::Value& v) { return static_cast<T>(Codec<U>::decode(v)); }
};

template <class T>
struct Codec<T, std::enable_if_t<std::is_floating_point_v<T>>> {
  using is_lspawn_codec = void;
  static proto::Value encode(T x) { return proto::Value::of_double(static_cast<double>(x)); }
  static T decode(const proto::Value& v) {
    if (v.kind != proto::Value::Kind::kDouble) codec_detail::throw_kind_mismatch("double", v);
    return static_cast<T>(v.f);
  }
};

template <>
struct Codec<std::string> {
  using is_lspawn_codec = void;
  static proto::Value encode(const std::string& s) { return proto::Value::of_string(s); }
  static std::string decode(const proto::Value& v) {
    if (v.kind != proto::Value::Kind::kString) codec_detail::throw_kind_mismatch("string", v);
    return v.s;
  }
};

template <class T>
struct Codec<std::vector<T>> {
  using is_lspawn_codec = void;
  static proto::Value encode(const std::vector<T>& xs) {
    proto::Value v = proto::Value::of_list();
    v.list.reserve(xs.size());
    for (const auto& x : xs) v.list.push_back(Codec<T>::encode(x));
    return v;
  }
  static std::vector<T> decode(const proto::Value& v) {
    if (v.kind != proto::Value::Kind::kList) codec_detail::throw_kind_mismatch("list", v);
    std::vector<T> out;
    out.reserve(v.list.size());
    for (const auto& item : v.list) out.push_back(Codec<T>::decode(item));
    return out;
  }
};

template <class... Ts>
struct Codec<std::tuple<Ts...>> {
  using is_lspawn_codec = void;
  static proto::Value encode(const std::tuple<Ts...>& t) {
    proto::Value v = proto::Value::of_list();
    std::apply([&](const auto&... x) { (v.list.push_back(Codec<Ts>::encode(x)), ...); }, t);
    return v;
  }
  static std::tuple<Ts...> decode(const proto::Value& v) {
    codec_detail::expect_list_size(v, sizeof...(Ts), "tuple");
    return decode_at(v, std::index_sequence_for<Ts...>{});
  }

 private:
  template <size_t... I>
  static std::tuple<Ts...> decode_at(const proto::Value& v, std::index_sequence<I...>) {
    return std::tuple<Ts...>(Codec<Ts>::decode(v.list[I])...);
  }
};

template <class A, class B>
struct Codec<std::pair<A, B>> {
  using is_lspawn_codec = void;
  static proto::Value encode(const std::pair<A, B>& p) {
    return Codec<std::tuple<A, B>>::encode(std::tuple<A, B>(p.first, p.second));
  }
  static std::pair<A, B> decode(const proto::Value& v) {
    auto t = Codec<std::tuple<A, B>>::decode(v);
    return {std::move(std::get<0>(t)), std::move(std::get<1>(t))};
  }
};

// std::optional<T>: an empty list for nullopt, a one-element list otherwise.
template <class T>
struct Codec<std::optional<T>> {
  using is_lspawn_codec = void;
  static proto::Value encode(const std::optional<T>& o) {
    proto::Value v = proto::Value::of_list();
    if (o) v.list.push_back(Codec<T>::encode(*o));
    return v;
  }
  static std::optional<T> decode(const proto::Value& v) {
    if (v.kind != proto::Value::Kind::kList) codec_detail::throw_kind_mismatch("list", v);
    if (v.list.empty()) return std::nullopt;
    codec_detail::expect_list_size(v, 1, "optional");
    return Codec<T>::decode(v.list[0]);
  }
};

template <class T>
struct Codec<std::map<std::string, T>> {
  using is_lspawn_codec = void;
  static proto::Value encode(const std::map<std::string, T>& m) {
    proto::Value v = proto::Value::of_list();
    for (const auto& [k, x] : m) v.list.push_back(Codec<std::pair<std::string, T>>::encode({k, x}));
    return v;
  }
  static std::map<std::string, T> decode(const proto::Value& v) {
    if (v.kind != proto::Value::Kind::kList) codec_detail::throw_kind_mismatch("list", v);
    std::map<std::string, T> out;
    for (const auto& item : v.list) {
      out.insert(Codec<std::pair<std::string, T>>::decode(item));
    }
    return out;
  }
};

// Encodes a tuple of arguments as the ValueList of a SpawnCall.
template <class... Ts>
proto::ValueList encode_args(const std::tuple<Ts...>& args) {
  proto::ValueList list;
  list.reserve(sizeof...(Ts));
  std::apply([&](const auto&... x) { (list.push_back(Codec<std::decay_t<decltype(x)>>::encode(x)), ...); }, args);
  return list;
}

}  // namespace lspawn
