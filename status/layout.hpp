// The per-rank status record: what each rank's collectives are doing, in a small file of shared
// memory that the launcher (or `lspawn status`) reads while the job runs (docs/hang-diagnosis.md).
//
// One file per rank, `<LSPAWN_STATUS_DIR>/rank-<RANK>.status`, created and mapped by the rank
// (status/recorder.hpp), mapped read-only by readers (status/reader.hpp). The file is a
// FileHeader followed by kMaxGroups GroupSlots: one slot per lspawn::Group the rank belongs to,
// claimed when the group is created, so "which ranks are members of group G" is "which ranks
// have a slot named G".
//
// Concurrency: a slot has one writer at a time (collectives of one group are issued from one
// thread at a time, collectives/group.hpp) and any number of readers in other processes. The
// mutable part of a slot is guarded by a seqlock: the writer makes `version` odd, stores the
// fields, makes it even again; a reader retries until it read the same even version before and
// after. Every field a reader may see while it is written is a lock-free std::atomic (address-
// free, so valid across processes), so a torn read is detected, never undefined.
//
// Why here, in its own torch-free library at the bottom of the layering: the launcher reads the
// layout and must not link LibTorch nor the runtime; the collectives write it and must not depend
// on the launcher. proto/ carries framed messages on pipes and files; this is a live
// shared-memory layout with a writer on the collectives' hot path, a different contract.
//
// Versioning: `magic` + `version`; a reader refuses a file whose version it does not know.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace lspawn::status {

inline constexpr char kMagic[8] = {'L', 'S', 'P', 'S', 'T', 'A', 'T', '\0'};
inline constexpr std::uint32_t kVersion = 1;
inline constexpr std::uint32_t kMaxGroups = 32;  // groups per rank with a slot; later ones go unrecorded
inline constexpr std::size_t kNameBytes = 64;    // group name, NUL-terminated (longer names are cut)
inline constexpr std::size_t kOpBytes = 24;      // op name, NUL-terminated
// The environment variable naming the directory of the records (set by lspawn for each worker).
inline constexpr const char* kDirEnv = "LSPAWN_STATUS_DIR";

enum class SlotState : std::uint32_t {
  Idle = 0,          // not in a collective of this group (since `since_us`)
  InCollective = 1,  // inside op #seq since `since_us` (from its start until it completed)
};

struct FileHeader {
  char magic[8];
  std::uint32_t version;
  std::uint32_t header_bytes;  // sizeof(FileHeader): where the slots start
  std::uint32_t slot_bytes;    // sizeof(GroupSlot)
  std::uint32_t slot_count;    // kMaxGroups
  std::int32_t rank;           // global rank (RANK)
  std::int32_t pid;            // the process that writes the record
  std::int64_t opened_us;      // CLOCK_REALTIME µs when the record was created
  // Signal whose handler writes the main thread's stack (status/stack_dump.hpp), 0: none.
  std::atomic<std::int32_t> stack_signal;
  // Slots in use; slot i < groups is fully named (release-stored after the name).
  std::atomic<std::uint32_t> groups;
  std::atomic<std::uint32_t> groups_dropped;  // groups created after the slots ran out
  std::uint32_t reserved[9];
};

struct GroupSlot {
  // Immutable once published through FileHeader::groups.
  char name[kNameBytes];
  std::int32_t group_rank;
  std::int32_t group_size;
  // Seqlock: odd while the writer changes the fields below; +2 per update.
  std::atomic<std::uint64_t> version;
  std::atomic<std::uint32_t> state;  // SlotState
  std::atomic<std::uint32_t> reserved0;
  std::atomic<std::uint64_t> seq;               // current op (InCollective) or the last one entered
  std::atomic<std::uint64_t> op[kOpBytes / 8];  // its name, NUL-padded
  std::atomic<std::uint64_t> bytes;             // its payload on this rank
  std::atomic<std::int64_t> since_us;           // CLOCK_REALTIME µs: entered (InCollective) / left (Idle)
  std::atomic<std::uint64_t> completed_seq;     // last op that completed, 0: none yet
  std::atomic<std::uint64_t> completed_op[kOpBytes / 8];
  std::atomic<std::int64_t> completed_us;  // when it completed
};

static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "shared-memory atomics must be lock-free");
static_assert(std::atomic<std::int32_t>::is_always_lock_free, "shared-memory atomics must be lock-free");

inline constexpr std::size_t kFileBytes = sizeof(FileHeader) + kMaxGroups * sizeof(GroupSlot);

}  // namespace lspawn::status
