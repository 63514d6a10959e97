#include "report/python_hint.h"

namespace ctrun {

std::string MissingTorchNote(const std::string& worker_output, const std::string& interpreter, InterpreterFrom from) {
  if (interpreter.empty()) return "";
  // Python 3: "ModuleNotFoundError: No module named 'torch'" (or 'torch.xyz' for a submodule).
  if (worker_output.find("No module named 'torch'") == std::string::npos &&
      worker_output.find("No module named 'torch.") == std::string::npos)
    return "";
  constexpr const char* kDebianPython = "/usr/bin/python3";
  if (from == InterpreterFrom::kShebang)
    return "the worker ran under " + interpreter + ", which its #! line chose and which cannot import torch; "
           "change that line, or run the script under an interpreter that has torch (ctrun ... " +
           (interpreter == kDebianPython ? std::string("/path/to/python3") : std::string(kDebianPython)) + " SCRIPT)";
  std::string note = "the worker ran under " + interpreter + ", which cannot import torch; choose an "
                     "interpreter that has it with PYTHON_EXEC";
  note += interpreter == kDebianPython ? "=/path/to/python3 (or install torch for it)"
                                       : std::string(", e.g. PYTHON_EXEC=") + kDebianPython;
  return note;
}

std::string AgentStorePortNote(const std::string& worker_output, int agent_store_port) {
  // torch names the port it failed to bind ("...bind to [::]:29500 (errno: 98 - Address already in
  // use)"): another port's failure is not about the agent store.
  if (agent_store_port <= 0 || worker_output.find("Address already in use") == std::string::npos ||
      worker_output.find(":" + std::to_string(agent_store_port)) == std::string::npos)
    return "";
  return "MASTER_PORT=" + std::to_string(agent_store_port) +
         " is ctrun's agent store (TORCHELASTIC_USE_AGENT_STORE=True), which the workers share: a worker that "
         "starts its own TCPStore server there cannot bind it; connect to it as a client (is_master=False), or "
         "pass --no-agent-store to let rank 0 host the store as under torch 1.13's torchrun";
}

}  // namespace ctrun
