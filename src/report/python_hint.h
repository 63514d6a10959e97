// Notes the failure summary adds from what a worker printed: a Python worker that could not import
// torch (the interpreter that ran it, the first python3 on PATH may be a pyenv shim or a venv
// without torch, and how to choose another), and a worker that could not bind the agent store's
// port. Pure: text in, text out.
#pragma once

#include <string>

namespace ctrun {

// Who chose the interpreter the workers ran under.
enum class InterpreterFrom { kPythonExec, kShebang };

// "" unless `worker_output` (stderr tail and error-file traceback) shows Python failing to import
// torch ("No module named 'torch'" / "No module named 'torch.distributed'"...) and `interpreter`
// is known; otherwise one line (no newline) for the summary's "note" field. For a script run by
// its #! line, PYTHON_EXEC does not apply: the note says how to choose the interpreter there.
std::string MissingTorchNote(const std::string& worker_output, const std::string& interpreter,
                             InterpreterFrom from = InterpreterFrom::kPythonExec);

// "" unless ctrun hosts the workers' store on `agent_store_port` (> 0) and `worker_output` shows
// a bind failing with "Address already in use" that names ":<that port>": a script that starts its
// own TCPStore server at MASTER_ADDR:MASTER_PORT (torch 1.13 let rank 0 host it) finds ctrun's
// there. Otherwise one line (no newline) naming the port and --no-agent-store.
std::string AgentStorePortNote(const std::string& worker_output, int agent_store_port);

}  // namespace ctrun
