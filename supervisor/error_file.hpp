// Reading the error file a failed worker left at TORCHELASTIC_ERROR_FILE.
//
// Two formats are accepted:
//   - lspawn's own: proto/messages.hpp ErrorReport as JSON (runtime/ and spawn() children write
//     it with lspawn::wire::write_json_file; files of older builds, int64 fields as strings, too);
//   - torchrun's: what Python's torch.distributed.elastic `@record` writes,
//     {"message": {"message": "RuntimeError: boom",
//                  "extraInfo": {"py_callstack": "...", "timestamp": "1700000000"}}}
//     (also {"message": "text"}), mapped onto ErrorReport: exception_type is the text before
//     the first ": " when it looks like a type name, message the rest, backtrace py_callstack.
#pragma once

#include <optional>
#include <string>

#include "proto/messages.hpp"

namespace lspawn {

struct ErrorFileResult {
  std::optional<proto::ErrorReport> report;  // set when the file existed and parsed
  std::string problem;                       // why a file that exists could not be used (empty otherwise)
};

// Reads `path`. A missing file is not a problem (the worker did not write one). Bounded at
// 1 MiB. Never throws.
ErrorFileResult read_error_file(const std::string& path);

// Writes `report` to `path` atomically (wire::write_json_file), filling version. Throws
// wire::WireError.
void write_error_file(const std::string& path, proto::ErrorReport report);

}  // namespace lspawn
