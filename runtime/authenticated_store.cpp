#include "runtime/authenticated_store.hpp"

#include <cstdio>
#include <stdexcept>
#include <thread>

#include "runtime/rendezvous.hpp"
#include "runtime/store_extended_api.hpp"

namespace lspawn {
namespace {
using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kRecheck{10};
}  // namespace

AuthenticatedStore::AuthenticatedStore(c10::intrusive_ptr<c10d::Store> store, RecordAuth auth, std::string who,
                                       Report report)
    : ForwardingStore(std::move(store)), auth_(std::move(auth)), who_(std::move(who)), report_(std::move(report)) {
  if (!report_) {
    report_ = [](const std::string& line) {
      std::fprintf(stderr, "[lspawn] %s\n", line.c_str());
      std::fflush(stderr);
    };
  }
  timeout_ = inner_->getTimeout();
}

std::vector<std::string> AuthenticatedStore::names(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(auth_.key_name(k));
  return out;
}

void AuthenticatedStore::refuse(const std::string& key, const std::string& why, const std::vector<uint8_t>& value) {
  {
    std::lock_guard<std::mutex> lock(m_);
    if (!reported_.insert(key + "\n" + std::string(value.begin(), value.end())).second) return;
  }
  refused_.fetch_add(1, std::memory_order_relaxed);
  report_(who_ + ": refused a store record for '" + key + "' " + describe_foreign_record(value) + ": " + why +
          "; ignoring it");
}

void AuthenticatedStore::look_for_strangers(const std::string& key) {
  if (!watching_.load(std::memory_order_relaxed)) return;
  if (auto plain = try_get(*inner_, key)) refuse(key, "not signed with this job's secret", *plain);
}

void AuthenticatedStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  inner_->set(auth_.key_name(key), auth_.seal(key, value));
}

std::vector<uint8_t> AuthenticatedStore::compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                                    const std::vector<uint8_t>& desired) {
  look_for_strangers(key);
  // An empty `expected` means "create if absent" to TCPStore: keep it empty.
  const auto sealed_expected = expected.empty() ? expected : auth_.seal(key, expected);
  const auto got = inner_->compareSet(auth_.key_name(key), sealed_expected, auth_.seal(key, desired));
  if (got == sealed_expected) return expected;
  if (auto v = auth_.open(key, got)) return std::move(*v);
  refuse(key, "bad MAC (not written with this job's secret)", got);
  return expected;  // as if absent / unchanged
}

std::vector<uint8_t> AuthenticatedStore::get(const std::string& key) {
  look_for_strangers(key);
  const std::string name = auth_.key_name(key);
  return open_or_wait(key, name, get_when_set(*inner_, name));  // waits for the key (store timeout)
}

std::vector<uint8_t> AuthenticatedStore::open_or_wait(const std::string& key, const std::string& name,
                                                      std::vector<uint8_t> sealed) {
  if (auto v = auth_.open(key, sealed)) return std::move(*v);
  refuse(key, "bad MAC (not written with this job's secret)", sealed);
  // Wait for a valid record: the legitimate writer may not have written yet.
  const auto t0 = Clock::now();
  const auto deadline = t0 + getTimeout();
  while (Clock::now() < deadline) {
    std::this_thread::sleep_for(kRecheck);
    auto again = try_get(*inner_, name);
    if (!again || *again == sealed) continue;
    if (auto v = auth_.open(key, *again)) return std::move(*v);
    refuse(key, "bad MAC (not written with this job's secret)", *again);
    sealed = std::move(*again);
  }
  throw std::runtime_error(who_ + ": no record for '" + key + "' signed with this job's secret within " +
                           std::to_string(getTimeout().count()) + " ms (refused: " + describe_foreign_record(sealed) +
                           ")");
}

bool AuthenticatedStore::hasExtendedApi() const { return compat::has_extended_api(*inner_); }

std::vector<std::vector<uint8_t>> AuthenticatedStore::multiGet(const std::vector<std::string>& keys) {
  for (const auto& k : keys) look_for_strangers(k);
  const auto key_names = names(keys);
  auto sealed = compat::multi_get(*inner_, key_names);  // waits for every key (store timeout)
  if (sealed.size() != keys.size()) {
    throw std::runtime_error(who_ + ": the store answered " + std::to_string(sealed.size()) + " values for " +
                             std::to_string(keys.size()) + " keys");
  }
  std::vector<std::vector<uint8_t>> values;
  values.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    // An empty value is never a sealed record: a wait woken without the key. Read it as get() does.
    if (sealed[i].empty()) sealed[i] = get_when_set(*inner_, key_names[i]);
    values.push_back(open_or_wait(keys[i], key_names[i], std::move(sealed[i])));
  }
  return values;
}

void AuthenticatedStore::multiSet(const std::vector<std::string>& keys,
                                  const std::vector<std::vector<uint8_t>>& values) {
  if (keys.size() != values.size()) {
    throw std::invalid_argument(who_ + ": multiSet of " + std::to_string(keys.size()) + " keys with " +
                                std::to_string(values.size()) + " values");
  }
  std::vector<std::vector<uint8_t>> sealed;
  sealed.reserve(values.size());
  for (size_t i = 0; i < keys.size(); ++i) sealed.push_back(auth_.seal(keys[i], values[i]));
  compat::multi_set(*inner_, names(keys), sealed);
}

void AuthenticatedStore::append(const std::string& key, const std::vector<uint8_t>& value) {
  const std::string name = auth_.key_name(key);
  std::vector<uint8_t> current;  // the sealed record we last saw; empty: absent
  std::vector<uint8_t> plain;    // what it carries
  // Start from the record as it is: from "absent", a record that already holds exactly the
  // result (the same bytes appended to an empty record before) would read as our own swap.
  auto adopt = [&](std::vector<uint8_t> sealed) {
    auto opened = auth_.open(key, sealed);
    if (!opened) {
      refuse(key, "bad MAC (not written with this job's secret)", sealed);
      throw std::runtime_error(who_ + ": cannot append to '" + key +
                               "': its record is not signed with this job's secret (" +
                               describe_foreign_record(sealed) + ")");
    }
    current = std::move(sealed);
    plain = std::move(*opened);
  };
  if (auto existing = try_get(*inner_, name)) adopt(std::move(*existing));
  for (;;) {
    std::vector<uint8_t> whole = plain;
    whole.insert(whole.end(), value.begin(), value.end());
    auto desired = auth_.seal(key, whole);
    auto got = inner_->compareSet(name, current, desired);
    if (got == desired) return;
    if (got == current) {  // `current` is gone (deleted meanwhile): start from an absent record
      current.clear();
      plain.clear();
      continue;
    }
    adopt(std::move(got));
  }
}

int64_t AuthenticatedStore::add(const std::string& key, int64_t value) {
  return inner_->add(auth_.key_name(key), value);
}

bool AuthenticatedStore::deleteKey(const std::string& key) { return inner_->deleteKey(auth_.key_name(key)); }

bool AuthenticatedStore::check(const std::vector<std::string>& keys) { return inner_->check(names(keys)); }

int64_t AuthenticatedStore::getNumKeys() { return inner_->getNumKeys(); }

void AuthenticatedStore::wait(const std::vector<std::string>& keys) { inner_->wait(names(keys)); }

void AuthenticatedStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  inner_->wait(names(keys), timeout);
}

const std::chrono::milliseconds& AuthenticatedStore::getTimeout() const noexcept { return inner_->getTimeout(); }

void AuthenticatedStore::setTimeout(const std::chrono::milliseconds& timeout) { inner_->setTimeout(timeout); }

}  // namespace lspawn
