// How many threads the calling process runs: the guard before fork().
#pragma once

namespace lspawn {

// Number of entries in /proc/self/task (1 for a single-threaded process), or -1 if unreadable.
int count_threads() noexcept;

}  // namespace lspawn
