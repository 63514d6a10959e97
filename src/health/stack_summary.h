// StackSummary: the outcome of one rank's stack capture (StackCapture), as the agent logs it, puts
// in the failure summary and the events file. Plain data.
#pragma once

#include <string>

namespace ctrun::health {

struct StackSummary {
  // One line: "stacks of 3 processes saved in DIR (native: eu-stack; Python: 1 process, on the
  // rank's stderr)", "stacks of 2 of 3 processes saved ...", "stacks not captured: ...".
  std::string text;
  // Everything asked for was saved: the native stacks of every process of the rank, every Python
  // dump, within the capture's bound. False for a partial capture, one that saved nothing, or none.
  bool complete = false;
};

}  // namespace ctrun::health
