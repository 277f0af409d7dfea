// AuthenticatedStore: a c10d::Store view in which every record is stored under a secret-derived
// name and sealed with the job's secret (runtime/record_auth.hpp), so that a client of the same
// TCPStore without the secret can neither join the group nor redirect its connections.
//
// rendezvous() puts it directly over the TCPStore when the worker has a job secret
// (LSPAWN_JOB_SECRET; lspawn always gives one): everything above it — the rendezvous records
// (host, pid), gloo's pair addresses (connectFullMesh), the collectives' own keys — is
// authenticated without knowing it. Without a secret (workers started by torchrun) the store is
// used as it is, as under torch.
//
// What each operation does with key k:
//   set / get / compareSet: on RecordAuth::key_name(k), values sealed / opened.
//   add / check / wait / deleteKey: on key_name(k) (counters are not sealed; nobody without the
//     secret can name them).
//   getNumKeys: the store's.
//   multiGet / multiSet / append / hasExtendedApi (c10d::Store's extended API, LibTorch 2.x;
//     runtime/store_extended_api.hpp): hasExtendedApi() is the store's, so that gloo batches its
//     reads of the peers' addresses (GLOO_ENABLE_STORE_V2_API=1; docs/scale-gloo-mesh.md).
//     multiGet: the watch below for each key, then one store multiGet of the key_names; each
//     value opened as get() opens it — a refused or empty one is waited for, for that key alone,
//     exactly as get() waits. multiSet: each value sealed, one store multiSet. append: a
//     compareSet loop on the sealed whole (read, open, add, seal, swap): no byte ever reaches a
//     reader unsealed, at O(size) per call (the store's own append would put unsealed bytes after
//     a sealed record); a refused record is reported and the append throws. As with c10d's own
//     fallback (Store::append), two appends racing from the same value with the same bytes may
//     count once: compareSet does not say whether it swapped. Neither lspawn nor gloo appends.
//
// Refusals (each reported once through `report`, naming the key, the reporting rank and what the
// record claims: its host/pid or the addresses it points to):
//   - a value under key_name(k) whose MAC is wrong (someone who learnt the name — by sniffing a
//     multi-node job's plain-text store traffic — wrote over it): get() ignores it and waits for a
//     valid one until the store's timeout, then throws naming the refusal; compareSet() treats it
//     as absent.
//   - while watch_strangers() is on (init_process_group: during rendezvous and the process
//     group's connection), a get()/compareSet() of k also looks at the plain key k, where a client
//     that speaks the protocol without the secret would write: such a record is reported, never
//     read.
//
// Thread-safe as far as the underlying store is (TCPStore: yes).
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "runtime/record_auth.hpp"
#include "runtime/torch_compat.hpp"

namespace lspawn {

class AuthenticatedStore final : public compat::ForwardingStore<AuthenticatedStore> {
 public:
  using Report = std::function<void(const std::string&)>;
  // `who` ("rank 2/4") starts each report; `report` defaults to one "[lspawn] ..." line on stderr.
  AuthenticatedStore(c10::intrusive_ptr<c10d::Store> store, RecordAuth auth, std::string who, Report report = {});

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
  const std::chrono::milliseconds& getTimeout() const noexcept override;
  void setTimeout(const std::chrono::milliseconds& timeout) override;
  // c10d::Store's extended API where it exists (2.x), without `override` so that this compiles
  // on 1.13 too, where they are plain members nothing calls (hasExtendedApi() is false there).
  bool hasExtendedApi() const;
  std::vector<std::vector<uint8_t>> multiGet(const std::vector<std::string>& keys);
  void multiSet(const std::vector<std::string>& keys, const std::vector<std::vector<uint8_t>>& values);
  void append(const std::string& key, const std::vector<uint8_t>& value);
  // 2.x's clone() (compat::ForwardingStore): the same view over a clone of the store.
  c10::intrusive_ptr<c10d::Store> clone_over(c10::intrusive_ptr<c10d::Store> inner) const {
    return c10::make_intrusive<AuthenticatedStore>(std::move(inner), auth_, who_, report_);
  }

  // Turns the look at plain keys (see above) on or off; off by default.
  void watch_strangers(bool on) { watching_.store(on, std::memory_order_relaxed); }
  // How many records were refused so far (tests, the fault matrix).
  int refused() const { return refused_.load(std::memory_order_relaxed); }

 private:
  std::vector<std::string> names(const std::vector<std::string>& keys) const;
  void refuse(const std::string& key, const std::string& why, const std::vector<uint8_t>& value);
  void look_for_strangers(const std::string& key);
  // The value inside `sealed` (the record under `name`) when it opens; else refuses it and waits
  // for a valid one as get() does (until the store's timeout, then throws).
  std::vector<uint8_t> open_or_wait(const std::string& key, const std::string& name, std::vector<uint8_t> sealed);

  RecordAuth auth_;
  std::string who_;
  Report report_;
  std::atomic<bool> watching_{false};
  std::atomic<int> refused_{0};
  std::mutex m_;                    // guards reported_
  std::set<std::string> reported_;  // "<key>\n<value>" already reported (each once)
};

}  // namespace lspawn
