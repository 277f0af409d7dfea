// The collectives' test worker (worker.cpp) as a function: the program
// lspawn_collectives_test_worker is its main (worker_main.cpp), and collectives_test links it to
// fork its ranks without an exec (ranks.hpp's Worker).
#pragma once

namespace lspawn::test {

// main() of `lspawn_collectives_test_worker <scenario> <backend>` (worker.cpp's header says the
// scenarios, the environment and the exit codes).
int collectives_worker_main(int argc, char** argv);

}  // namespace lspawn::test
