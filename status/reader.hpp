// status::RecordReader: the reading side of the per-rank status record (status/layout.hpp), for
// the launcher's hang watch and `lspawn status`. Maps the file read-only; read() takes a
// consistent snapshot of every slot (seqlock: retries while a slot is being written).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace lspawn::status {

// One group's slot, as read.
struct GroupView {
  std::string name;
  int group_rank = 0;
  int group_size = 0;
  bool in_collective = false;
  std::uint64_t seq = 0;  // current op (in_collective) or the last one entered, 0: none
  std::string op;
  std::uint64_t bytes = 0;
  std::int64_t since_us = 0;        // entered (in_collective) / left (idle), CLOCK_REALTIME µs
  std::uint64_t completed_seq = 0;  // 0: none completed yet
  std::string completed_op;
  std::int64_t completed_us = 0;
  std::uint64_t version = 0;  // changes on every update: progress
};

// A rank's record, as read.
struct RankView {
  int rank = -1;
  int pid = 0;
  std::int64_t opened_us = 0;
  int stack_signal = 0;
  std::vector<GroupView> groups;
  std::uint32_t groups_dropped = 0;
  bool torn = false;  // a slot stayed mid-write through every retry (its writer died there?)
};

class RecordReader {
 public:
  RecordReader() = default;
  ~RecordReader();
  RecordReader(RecordReader&& o) noexcept;
  RecordReader& operator=(RecordReader&& o) noexcept;

  // Maps `path`. Returns nullopt when it does not exist (yet); throws std::runtime_error when
  // it exists but is not a status record of a known version and size.
  static std::optional<RecordReader> open(const std::string& path);

  // A consistent snapshot.
  RankView read() const;
  // The sum of every slot's version and the slot count: changes whenever the rank records.
  std::uint64_t progress() const;

 private:
  const void* map_ = nullptr;
  std::size_t len_ = 0;
};

// Path of rank `rank`'s file `rank-<rank>.<kind>` in `dir` ("status", "stack", the start-phase
// markers of status/phase.hpp); its record / stack file.
std::string rank_file(const std::string& dir, int rank, const std::string& kind);
std::string record_path(const std::string& dir, int rank);
std::string stack_path(const std::string& dir, int rank);

// This process's status directory and rank, from LSPAWN_STATUS_DIR and RANK (set by lspawn for
// each worker); nullopt when either is unset or RANK is not a rank.
struct RankPlace {
  std::string dir;
  int rank = -1;
};
std::optional<RankPlace> rank_place_from_environment();

}  // namespace lspawn::status
