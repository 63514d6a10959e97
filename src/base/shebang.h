// The #! line of a script, parsed as Linux's binfmt_script does: the interpreter is the first
// word after "#!" (blanks: space and tab), and everything after it, trimmed, is one optional
// argument. Pure: text in, values out.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace ctrun {

struct Shebang {
  std::string interpreter;  // "/usr/bin/env"
  std::string arg;          // "python3 -u" ("" when none)
};

// nullopt unless `head` (the file's first bytes) starts with "#!" and names an interpreter.
std::optional<Shebang> ParseShebang(std::string_view head);

// The program a #! line runs the script with: the interpreter, or for "#!/usr/bin/env [-S]
// [-opts] [NAME=VALUE...] PROG ..." the PROG that env(1) looks up on PATH (as written: a bare
// name is not resolved here).
std::string ShebangProgram(const Shebang& s);

// Whether a program's file name is a Python interpreter's: "python", "python3", "python3.11" (a
// directory part is ignored). The one test of "is this Python" for entrypoints, #! lines and
// running workers' executables.
bool IsPythonProgram(std::string_view path);

}  // namespace ctrun
