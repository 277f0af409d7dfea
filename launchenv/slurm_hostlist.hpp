// Slurm hostlist expressions (SLURM_JOB_NODELIST, SLURM_NODELIST, SLURM_STEP_NODELIST): the
// compressed lists Slurm hands to every job, expanded the way `scontrol show hostnames` does.
//
// Grammar (Slurm's hostlist.c; the forms its documentation and 22.05 accept):
//   list    := item { ',' item }            (whitespace also separates items)
//   item    := text { '[' ranges ']' text } (a name with zero or more bracket groups)
//   ranges  := range { ',' range }
//   range   := NUM | NUM '-' NUM            (lo <= hi)
// - "n[01-04,07],gpu-a[1-2]" -> n01 n02 n03 n04 n07 gpu-a1 gpu-a2: commas inside brackets belong
//   to the ranges, outside they separate items.
// - Zero padding is kept: a range is printed with the width of its lower bound as written
//   ("n[08-10]" -> n08 n09 n10; "n[8-10]" -> n8 n9 n10).
// - Several groups in one name expand as their product, first group outermost
//   ("r[1-2]n[1-2]" -> r1n1 r1n2 r2n1 r2n2, "n[1-2][3-4]" -> n13 n14 n23 n24).
// - Empty items are skipped ("a,,b" and "a, b" -> a b); order is as written and duplicates are
//   kept ("a[1-2],a1" -> a1 a2 a1): Slurm's node order defines SLURM_NODEID.
// All of the above is what `scontrol show hostnames` of Slurm 22.05 prints (checked). Where 22.05
// is lax or odd, lspawn is strict: a ']' without '[' or an unclosed '[' ("n[1-2" -> Slurm: "n]"),
// spaces inside brackets, and control characters are errors. lspawn also accepts text after the
// last group ("n[1-2]-ib" -> n1-ib n2-ib), which 22.05 rejects (newer hostlist code accepts it).
// Not supported (rejected): Blue Gene style prisms "bgl[123x456]" (no Slurm 22.05 system
// without dimensions > 1 produces them).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "launchenv/env_syntax_error.hpp"

namespace lspawn::slurm {

// Hard limit on the expansion (Slurm itself refuses more than 64k hosts in one range); keeps a
// malformed or hostile value from exhausting memory.
inline constexpr size_t kMaxHosts = 1u << 20;

// Expands `text`, the value of the variable `variable` (named in errors). Throws EnvSyntaxError
// on a value with no name, an unclosed or stray bracket, a bad number or range (hi < lo,
// more than 18 digits), or an expansion of more than max_hosts names.
std::vector<std::string> expand_hostlist(std::string_view text, const std::string& variable,
                                         size_t max_hosts = kMaxHosts);

// The first host of the list, without expanding the rest (checks the whole syntax all the same).
std::string first_host(std::string_view text, const std::string& variable);

}  // namespace lspawn::slurm
