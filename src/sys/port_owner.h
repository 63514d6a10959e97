// Who holds a TCP port: for the one-line message when ctrun cannot bind the workers' store
// ("... held by pid 4242 (ctrun --master_port 29500 train.py), a run of this job that is still
// running"). Only called on that error path: it reads /proc/net/tcp{,6} for a socket bound to the
// port, then every /proc/<pid>/fd for the process holding that socket's inode, and the
// TORCHELASTIC_RUN_ID of that process or of its children (a launcher's workers carry it).
// Best effort and bounded by the size of /proc: anything unreadable (another user's processes)
// just leaves the holder unknown.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace ctrun {

struct PortHolder {
  pid_t pid = 0;         // 0: the socket exists but its process is not visible to this user
  std::string command;   // its command line, arguments joined by spaces, shortened
  std::string run_id;    // TORCHELASTIC_RUN_ID of the holder or one of its children; "" none
};

// The holder of a socket bound (listening, or otherwise not closing) to local TCP `port`;
// nullopt when /proc shows none. proc_root is "/proc" except in tests.
std::optional<PortHolder> FindPortHolder(int port, const std::string& proc_root = "/proc");

// The inodes of the sockets bound to `port` in one /proc/net/tcp or tcp6 text, listening ones
// first; TIME_WAIT entries (inode 0) are skipped. Exposed for tests.
std::vector<unsigned long> SocketInodesOnPort(const std::string& proc_net_tcp, int port);

// The message's explanation, e.g. "it is held by pid 42 (ctrun ... train.py), a run of this job
// (run id 'none') that is still running: stop it (kill 42) or pick another --master_port".
// entrypoint_name: this run's entrypoint file name, to tell "this job" apart when run ids are
// the default "none".
// port_flag: the flag that chose the port, for "pick another <port_flag>". single_node: whether
// "--standalone for a free one" is advice that applies (not for a multi-node rendezvous store).
std::string DescribePortHolder(const std::optional<PortHolder>& holder, const std::string& own_run_id,
                               const std::string& entrypoint_name, const std::string& port_flag,
                               bool single_node = true);

}  // namespace ctrun
