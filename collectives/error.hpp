// Errors thrown by lspawn collectives. One base, CollectiveError, carries what a user needs to
// find the culprit: the operation, the group, this rank, and the ranks concerned where known.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "proto/error.hpp"

namespace lspawn {

// A collective failed: timeout, a peer that died or closed its connection, a transport error.
// After a CollectiveError the group is in an unknown state; only destroy it.
class CollectiveError : public lspawn::Error {
 public:
  CollectiveError(std::string op, std::string group, std::vector<int> ranks, const std::string& what)
      : lspawn::Error(what), op_(std::move(op)), group_(std::move(group)), ranks_(std::move(ranks)) {}
  const std::string& op() const { return op_; }        // "all_reduce", "broadcast_object", …
  const std::string& group() const { return group_; }  // the group's name ("world", "sub1", …)
  // Group ranks known to be the cause (dead, late, mismatching); empty when unknown.
  const std::vector<int>& ranks() const { return ranks_; }

 private:
  std::string op_, group_;
  std::vector<int> ranks_;
};

// The op did not complete within the group's timeout.
class CollectiveTimeout : public CollectiveError {
 public:
  using CollectiveError::CollectiveError;
};

// Ranks called different operations, or the same one with different shapes / dtypes / ops /
// roots. ranks() lists the ranks whose call differs from rank 0's.
class CollectiveMismatch : public CollectiveError {
 public:
  using CollectiveError::CollectiveError;
};

}  // namespace lspawn
