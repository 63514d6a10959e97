// ctrun-docgen: writes one generated file at build time (never installed).
//   ctrun-docgen bash|zsh|fish OUT           shell completion from the option table
//   ctrun-docgen man VERSION README.md OUT   ctrun(1) from the option table and README.md
// Exit 0, or 1 with one line on stderr (a missing README section, an unwritable OUT).
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli/cli.h"
#include "docgen/completion.h"
#include "docgen/man_page.h"

namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "ctrun-docgen: %s\n", message.c_str());
  return 1;
}

int Write(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  return out ? 0 : Fail("cannot write " + path);
}

ctrun::StatusOr<std::string> ManPage(const std::string& version, const std::string& readme_path) {
  std::ifstream in(readme_path, std::ios::binary);
  if (!in) return ctrun::Status::Error("cannot read " + readme_path);
  std::stringstream readme;
  readme << in.rdbuf();
  return ctrun::docgen::ManPage({version, ctrun::OptionTable(), ctrun::HelpParagraphs(), readme.str()});
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  const std::string kind = args.empty() ? "" : args[0];
  if (args.size() == 2 && kind == "bash") return Write(args[1], ctrun::docgen::BashCompletion(ctrun::OptionTable()));
  if (args.size() == 2 && kind == "zsh") return Write(args[1], ctrun::docgen::ZshCompletion(ctrun::OptionTable()));
  if (args.size() == 2 && kind == "fish") return Write(args[1], ctrun::docgen::FishCompletion(ctrun::OptionTable()));
  if (args.size() == 4 && kind == "man") {
    ctrun::StatusOr<std::string> page = ManPage(args[1], args[2]);
    return page.ok() ? Write(args[3], *page) : Fail(page.message());
  }
  return Fail("usage: ctrun-docgen bash|zsh|fish OUT | man VERSION README.md OUT");
}
