// The one place that decides how a ctrun run ended: its OutcomeKind, its exit code and its root
// cause (README "Exit codes"). Everything that reports the end (the exit status, --summary-file,
// the GitHub annotation, the run_end event) reads the RunOutcome made here.
#pragma once

#include <string>
#include <vector>

#include "agent/agent.h"
#include "report/run_outcome.h"
#include "report/run_summary.h"

namespace ctrun {

// After the agent is done. failures: CollectFailures' list (by rank, error files loaded). Sets
// kind, exit_code, root_cause and root_cause_rank; the caller adds the rest (ranks, times, ...).
// The exit code: a signal to ctrun, 128+signal; the deadline, kExitMaxRunTime; multi-node, the
// outcome the agents agreed on (or this agent's rendezvous error); single node, the root cause
// chosen with the error files' timestamps; otherwise what the agent ended with.
RunOutcome DecideJobOutcome(const Agent& agent, const std::vector<WorkerFailure>& failures);

// Runs that end before the agent runs: the kind's fixed exit code, and `message` as the root cause.
RunOutcome EarlyOutcome(OutcomeKind kind, const std::string& message);

// "rank 1 (local_rank 1, pid 4242) exited with code 3: <first line of its error file's message>".
std::string DescribeFailure(const WorkerFailure& f);

}  // namespace ctrun
