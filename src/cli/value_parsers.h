// Value parsers for ctrun's command line: one pure function per flag syntax (string -> value).
// Each returns the value, or a Status whose message is the *reason* only ("must be >= 1"); the
// caller (cli.cc) prefixes the flag or environment variable and the offending text. They follow
// torchrun's own parsers (run.py parse_min_max_nnodes, determine_local_world_size,
// rendezvous/utils.py _parse_rendezvous_config, comma_separated_list) but reject what torchrun
// would crash on later. No side effects, no globals.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "config/launch_config.h"

namespace ctrun {

// A whole-string integer: optional surrounding ASCII blanks and a leading '+' or '-' (like
// Python's int()); anything else, or out of the range of int, is an error.
StatusOr<int> ParseInt(std::string_view text);
// A finite decimal number ("0.1", "5", "1e-3"); blanks around it allowed; nan/inf rejected.
StatusOr<double> ParseNumber(std::string_view text);

// The longest time any option takes: about 31 years. Beyond ~9.2e9 s a time no longer fits the
// clocks' 64-bit nanoseconds (it would wrap to a time already past).
inline constexpr double kMaxSeconds = 1e9;
// A number of seconds: > 0 (or >= 0 with zero_ok) and at most kMaxSeconds.
StatusOr<double> ParseSeconds(std::string_view text, bool zero_ok);

struct NodeRange {
  int min_nodes = 1;
  int max_nodes = 1;
};
// "N" or "MIN:MAX" with 0 < MIN <= MAX. More than two parts is an error.
StatusOr<NodeRange> ParseNnodes(std::string_view text);
// The --nnodes text of a range, as ParseNnodes reads it: "N" when MIN == MAX, else "MIN:MAX".
std::string FormatNnodes(int min_nodes, int max_nodes);

// An integer >= 1, "cpu", "gpu" or "auto". "xpu" (and other accelerator names) are reported as
// not supported.
StatusOr<NprocSpec> ParseNprocPerNode(std::string_view text);

// "k1=v1,k2=v2" -> map; blanks around keys and values trimmed; empty or blank text -> empty map.
// An entry without a key, or a key without a value, is an error.
StatusOr<std::map<std::string, std::string>> ParseRdzvConf(std::string_view text);

// "SIGTERM,INT,15" -> signal numbers, in order, duplicates dropped. Unknown names, empty entries
// and the signals no process can catch (SIGKILL, SIGSTOP) are errors. Empty text is an error.
StatusOr<std::vector<int>> ParseSignalList(std::string_view text);

// A TCP port, 1..65535.
StatusOr<int> ParsePort(std::string_view text);

// A host address without a port (--master_addr, --local_addr): a name, an IPv4 address, or an IPv6
// address with or without brackets ("[::1]" and "::1" both give "::1"). "host:port" and
// "[v6]:port" are errors that point to the port flag; so are empty text and unbalanced brackets.
StatusOr<std::string> ParseAddress(std::string_view text);

// --gpus: "0,2,3" or "0-3,6": distinct non-negative integers, in the order given.
StatusOr<std::vector<int>> ParseIndexList(std::string_view text);

// --debug-rank: "RANK" or "RANK:PORT" -> {rank, port}; port 0 when not given.
StatusOr<std::pair<int, int>> ParseDebugRank(std::string_view text);

// torchrun's comma_separated_list: split on ',', where ",," stands for a literal comma. Empty text
// gives an empty list (torchrun would give [""], a filter matching every line).
std::vector<std::string> SplitCommaEscaped(std::string_view text);

}  // namespace ctrun
