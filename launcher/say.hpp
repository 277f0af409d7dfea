// lspawn's own lines on stderr (fd 2), shared by the command's steps (cli.cpp, run.cpp): each
// call is one write_all of the whole text; an error writing it (stderr closed, a broken pipe) is
// ignored, so a message never fails the run.
#pragma once

#include <string>

namespace lspawn::cli {

// "lspawn: LINE\n".
void say(const std::string& line);
// `text` as it is (a report or a summary that carries its own "lspawn: " lines).
void write_stderr(const std::string& text);
// "1 worker", "N workers": a count in these lines.
std::string workers_text(int n);

}  // namespace lspawn::cli
