// The names of the shared-memory segments lspawn's shm backend creates (shm/communicator.cpp),
// and their removal when the process that created one is gone.
//
// A segment is named /lspawn-<label>-<creator pid>-<random hex>, so the name says who made it.
// Its creator (rank 0 of the group) unlinks it once every rank has mapped it; killed before
// that (SIGKILL while it waits for a late rank in the segment's first round), it leaves the name
// in /dev/shm until reboot, and the other ranks cannot remove it: they are stopped before they
// read the name (bench/soak, phase kill-construct: 4 MiB a kill at N = 2). So whoever reaps a
// worker (the Supervisor) removes what that pid left: remove_shm_segments_of(pid).
#pragma once

#include <cstdint>
#include <string>
#include <sys/types.h>

namespace lspawn::sys {

// "/lspawn-<label>-<pid>-<nonce in hex>", `label` reduced to [A-Za-z0-9_] and 64 characters.
std::string shm_segment_name(const std::string& label, pid_t pid, uint64_t nonce);

// Unlinks every segment of shm_segment_name()'s form whose creator is `pid` (under `dir`, the
// folder where shm_open's names live). Returns how many it removed; errors are ignored (a name
// another process removed first, a folder that cannot be read).
int remove_shm_segments_of(pid_t pid, const std::string& dir = "/dev/shm");

}  // namespace lspawn::sys
