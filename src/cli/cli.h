// ctrun's command line: argv + environment -> LaunchConfig, or a message and an exit code.
//
// Contract:
//  - Accepts every flag of torchrun (PyTorch 2.x; kOptions in cli.cc) in both spellings (--nproc-per-node
//    and --nproc_per_node), with torchrun's defaults, unique-prefix abbreviations (argparse's
//    allow_abbrev: --nnode=2 means --nnodes=2) and PET_<DEST_UPPER> environment fallbacks: an
//    explicit flag wins; boolean PET_ variables are integers, non-zero sets the flag, 0 leaves it unset.
//  - The first argument that is not an option (or the one after "--") is the entrypoint; it and
//    everything after it go to the worker unchanged, even when they look like ctrun flags.
//  - Values are validated here (ranges, choices, syntax) but nothing is checked against the system:
//    parsing opens no file, spawns nothing and reads the environment only through `env`. A value
//    ctrun cannot honour (a --logs-specs plugin other than torchrun's 'default') is refused here
//    with a reason and exit code 2, never silently ignored.
//  - Bad input gives Action::kExit with exit_code 2 and `error` = exactly one line,
//    "ctrun: error: <problem naming the flag or variable and the value>\n"; `config.summary_file`
//    and `config.events_file` then hold the paths given, as far as the arguments could be read,
//    so the usage error can be reported there too.
//  - -h/--help and --version give Action::kExit, exit_code 0 and the text in `output`.
// Thread-safe and reentrant: no global state.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "base/environment.h"
#include "config/launch_config.h"

namespace ctrun {

// Result of parsing. kRun: `config` is valid. kExit: write `output` to stdout (help, version) and
// `error` to stderr, verbatim (each is empty or ends in '\n'), then exit with `exit_code`.
struct CliOutcome {
  enum class Action { kRun, kExit };
  Action action = Action::kExit;
  LaunchConfig config;
  int exit_code = 0;
  std::string output;
  std::string error;
};

// Returns the value of an environment variable, or nullopt when it is not set.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

// argv[0] is the program name (ignored); argv[1..] are the arguments.
CliOutcome ParseCommandLine(const std::vector<std::string>& argv, const EnvLookup& env);

// The --help text (also what ParseCommandLine returns for -h/--help).
std::string HelpText();
// The --version text, one line ending in '\n': the version and the torchrun it follows.
std::string VersionText();
// ctrun's version alone ("0.1.0"), for the summary and events files.
std::string VersionNumber();

// One option of the table that drives ParseCommandLine and --help, for the generators of shell
// completion and the man page (src/docgen): they read the table itself, so they cannot drift from it.
struct OptionInfo {
  std::vector<std::string> long_names;  // every accepted spelling, "--foo-bar" first, then "--foo_bar", alias'
  char short_name = '\0';               // '\0' when none
  bool takes_value = false;
  std::string metavar;                  // as in --help ("N|cpu|gpu|auto"); "" for on/off options
  std::vector<std::string> choices;     // the metavar's literal values: all that is accepted when it has no
                                        // UPPERCASE placeholder (static|c10d|...), else keywords (cpu, gpu, auto)
  std::string default_text;             // "" when --help shows none
  std::string env;                      // the fallback environment variable, "" when none
  std::string group;                    // the --help section title
  std::string help;
};
// Every option, in --help order.
std::vector<OptionInfo> OptionTable();
// The paragraphs --help prints between the usage lines and the options.
std::vector<std::string> HelpParagraphs();

// An EnvLookup over an environment read once (main: Environment::FromProcess()); it must outlive
// the lookup. Tests pass a map instead.
EnvLookup LookupIn(const Environment& env);

// The dest names ("node_rank", "standalone", ...) of the options the user set explicitly: given on
// the command line before the entrypoint, in any form ParseCommandLine accepts (--node-rank 1,
// --node_rank=1, a unique prefix, a short option), or through their environment fallback ([env: X]
// in --help) when it is set; an on/off option's variable counts unless its value is the integer 0.
// Arguments ParseCommandLine would reject are skipped (it reports them). Sorted, no duplicates.
// For code that must not override a choice the user made (src/cli/cluster_env).
std::vector<std::string> ExplicitOptionDests(const std::vector<std::string>& argv, const EnvLookup& env);

}  // namespace ctrun
