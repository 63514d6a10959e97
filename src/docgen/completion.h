// Shell completion scripts for ctrun, generated from the option table (src/cli, the one behind
// parsing and --help), so a new or renamed option is completed without an edit here.
//
// Contract, for every shell: every spelling of every option (--foo-bar, --foo_bar, aliases, short
// names) is offered; after an option that takes a value, its choices (--rdzv_backend static|c10d|
// etcd|etcd-v2, --nproc_per_node cpu|gpu|auto, --redirects/--tee 0-3, --log-level, --start_method,
// ...), directories for a DIR value, nothing for free text; the entrypoint is completed as a file,
// and once it is on the line, options are no longer offered (the words after it are the worker's).
// Pure functions, no I/O.
#pragma once

#include <string>
#include <vector>

#include "cli/cli.h"

namespace ctrun::docgen {

// For /usr/share/bash-completion/completions/ctrun. Uses bash-completion's _init_completion
// (--opt=value and host:port kept whole) when it is loaded, plain COMP_WORDS otherwise.
std::string BashCompletion(const std::vector<OptionInfo>& options);

// For a directory on zsh's $fpath, as _ctrun (#compdef ctrun; _arguments).
std::string ZshCompletion(const std::vector<OptionInfo>& options);

// For fish's vendor_completions.d, as ctrun.fish.
std::string FishCompletion(const std::vector<OptionInfo>& options);

}  // namespace ctrun::docgen
