// CPU lists as the kernel writes them ("0-3,8,10-11": /sys/devices/system/cpu/online, a node's
// cpulist, a cache's shared_cpu_list, /proc/PID/status's Cpus_allowed_list), and the sets of
// CPUs a process may run on (sched_getaffinity / sched_setaffinity).
#pragma once

#include <string>
#include <vector>

namespace lspawn::placement {

// Sorted, without duplicates.
using CpuList = std::vector<int>;

// Parses "0-3,8" (spaces and a trailing newline allowed; "" is the empty list). Throws
// std::invalid_argument naming `what` (a file, a variable) and the text when it is not a list.
CpuList parse_cpu_list(const std::string& text, const std::string& what);

// "0-3,8": ranges where consecutive; "" for the empty list.
std::string cpu_list_text(const CpuList& cpus);

// The CPUs this process may run on (sched_getaffinity).
CpuList current_affinity();

// How many: what `nproc` prints; at least 1.
int usable_cpu_count();

// Makes `cpus` the calling thread's CPUs (and so those of the threads it starts later). 0 or an
// errno value. Allocates nothing: safe in a child between fork and exec.
int set_affinity(const CpuList& cpus);

CpuList intersect(const CpuList& a, const CpuList& b);

}  // namespace lspawn::placement
