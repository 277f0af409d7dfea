// lspawn::SerialExecutor: run a function in one local worker at a time (MpSerialExecutor).
// Link lspawn::spawn. Reference: spawn/serial_executor.hpp.
#pragma once

#include "spawn/serial_executor.hpp"
