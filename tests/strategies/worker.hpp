// The strategies' test worker (worker.cpp) as a function: the program
// lspawn_strategies_test_worker is its main (worker_main.cpp), and strategies_test links it to
// fork its ranks without an exec (tests/collectives/ranks.hpp's Worker), but for the scenario
// "spawn", whose lspawn::spawn() may start the program again (StartMethod::Spawn).
#pragma once

namespace lspawn::test {

// main() of `lspawn_strategies_test_worker <scenario> [backend]` (worker.cpp's header says the
// scenarios, the environment and the exit codes).
int strategies_worker_main(int argc, char** argv);

}  // namespace lspawn::test
