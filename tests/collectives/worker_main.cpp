// The program lspawn_collectives_test_worker: worker.cpp's scenarios, exec'd (by the multi-node
// tests, lspawn, or run_ranks() where it cannot fork).
#include "tests/collectives/worker.hpp"

int main(int argc, char** argv) { return lspawn::test::collectives_worker_main(argc, argv); }
