// Durations in lspawn's messages, written one way by every part.
//
//   seconds_number(d)  a set value as its flag takes it: "30", "2.5", "0.125" (at most three
//                      decimals, no trailing zeros): "(--hang-timeout 0.2)".
//   seconds_text(d)    the same with its unit, for a set value (a timeout, a grace period):
//                      "30 s", "2.5 s", "0.125 s".
//   elapsed_text(d)    a measured time, as precise as a reader needs: two significant digits
//                      under a second ("0.012 s", "0.4 s"), one decimal under 10 s ("7.0 s"),
//                      whole seconds above ("41 s"). Negative durations read as 0.
#pragma once

#include <chrono>
#include <string>

namespace lspawn {

std::string seconds_number(std::chrono::duration<double> d);
std::string seconds_text(std::chrono::duration<double> d);
std::string elapsed_text(std::chrono::duration<double> d);

}  // namespace lspawn
