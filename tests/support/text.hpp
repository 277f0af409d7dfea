// Reading what a program printed: occurrences, lines. Tests only.
#pragma once

#include <string>
#include <vector>

namespace lspawn::test {

// Occurrences of `needle` in `hay` (not overlapping).
int count(const std::string& hay, const std::string& needle);
// Whether `needle` occurs in `hay`.
bool has(const std::string& hay, const std::string& needle);
// Lines of `text` (without '\n').
std::vector<std::string> lines(const std::string& text);

}  // namespace lspawn::test
