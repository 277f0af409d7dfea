// lspawn::SerialExecutor: run a function in one local worker at a time (MpSerialExecutor).
// Link lspawn::spawn. Reference: launcher/spawn/serial_executor.hpp.
#pragma once

#include "launcher/spawn/serial_executor.hpp"
