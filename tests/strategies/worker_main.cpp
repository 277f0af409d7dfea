// The program lspawn_strategies_test_worker: worker.cpp's scenarios, exec'd (the "spawn" scenario,
// lspawn, or run_ranks() where it cannot fork).
#include "tests/strategies/worker.hpp"

int main(int argc, char** argv) { return lspawn::test::strategies_worker_main(argc, argv); }
