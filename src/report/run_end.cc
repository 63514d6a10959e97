#include "report/run_end.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "report/error_file.h"
#include "report/github_annotation.h"
#include "report/summary_file.h"

namespace ctrun {

std::string AnnotationTitle(const RunOutcome& outcome) {
  return std::string("ctrun: ") + OutcomeKindName(outcome.kind) + " (exit " + std::to_string(outcome.exit_code) + ")";
}

int ReportRunEnd(const RunOutcome& outcome, const RunIdentity& identity, const RunEndTargets& targets) {
  if (targets.events) {
    nlohmann::json fields{{"outcome", OutcomeKindName(outcome.kind)},
                          {"exit_code", outcome.exit_code},
                          {"root_cause", outcome.root_cause.empty() ? nlohmann::json(nullptr) : nlohmann::json(outcome.root_cause)},
                          {"attempts", outcome.attempts},
                          {"restarts", outcome.restarts},
                          {"duration_s", std::chrono::duration<double>(outcome.end - outcome.start).count()}};
    targets.events->Emit(events::kRunEnd, fields);
  }
  if (!targets.summary_file.empty())
    if (Status s = WriteSummaryFile(targets.summary_file, outcome, identity); !s.ok())
      spdlog::warn("{}", s.message());
  if (!targets.agent_error_file.empty() &&
      (outcome.kind == OutcomeKind::kSetupError || outcome.kind == OutcomeKind::kRendezvousError)) {
    ErrorFileRecord r;
    r.message = outcome.root_cause.empty() ? "ctrun exited with code " + std::to_string(outcome.exit_code)
                                           : outcome.root_cause;
    r.timestamp = std::chrono::duration_cast<std::chrono::seconds>(outcome.end.time_since_epoch()).count();
    if (Status s = WriteErrorFile(targets.agent_error_file, r); !s.ok())
      spdlog::warn("cannot write the agent's error file: {}", s.message());
  }
  if (targets.github_actions && outcome.exit_code != 0) {
    const std::string line = GithubErrorAnnotation(
        AnnotationTitle(outcome), outcome.root_cause.empty() ? "ctrun exited with code " + std::to_string(outcome.exit_code)
                                                             : outcome.root_cause);
    std::fflush(targets.annotation_out);
    std::fputs(line.c_str(), targets.annotation_out);
    std::fflush(targets.annotation_out);
  }
  return outcome.exit_code;
}

Status CheckSummaryPath(const std::string& path) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    return Status::Error("cannot write --summary-file " + path + ": " + dir.string() + " is not a directory");
  if (::access(dir.c_str(), W_OK) != 0) return Status::Errno("cannot write --summary-file " + path + " in " + dir.string(), errno);
  if (std::filesystem::is_directory(path, ec))  // found here, not after the job
    return Status::Error("cannot write --summary-file " + path + ": it is a directory");
  return Status::Ok();
}

}  // namespace ctrun
