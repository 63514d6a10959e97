// The bad input table: malformed command lines, PET_* and other environment values, rendezvous
// configurations, worker error files, snapshot files (worker library) and store messages, each with
// the exit code and the one-line message ctrun must give. Every row is checked the same way:
//  - ctrun ends within a bound with the expected code and prints the expected line (exit 2: its
//    only line on stderr, "ctrun: error: ...");
//  - no worker starts (the fake worker would create a marker file) unless the row is about what a
//    worker leaves behind (error files), where exactly one attempt per allowed restart runs;
//  - no process of the job is left (environment marker, see hygiene.h).
// Snapshot rows check the worker library's reader (verify_snapshot_file / load_latest) in process;
// store rows talk to a running ctrun's agent store over TCP, one connection per row.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>

#include "ctrun/snapshot_store.h"
#include "worker/crc32c.h"
#include "helpers/free_port.h"
#include "helpers/test_util.h"
#include "reliability/hygiene.h"

namespace ctrun::reliability {
namespace {

using namespace std::chrono_literals;
using ctrun::testing::BackgroundProcess;
using ctrun::testing::ReadEnvFile;
using ctrun::testing::ReadFileOr;
using ctrun::testing::RunCommand;
using ctrun::testing::RunResult;
using ctrun::testing::SplitLines;
using ctrun::testing::TempDir;
using ctrun::testing::WaitFor;

// "@W" in flags stands for the worker and its arguments (rows whose entrypoint is the bad input
// leave it out and name their own); {port} is replaced by a free loopback port.
struct Row {
  const char* kind;  // cli | env | rdzv | error-file
  std::vector<std::string> flags;
  std::vector<std::string> env;
  int exit_code;
  std::string message;
  std::vector<std::string> worker_args = {};  // error-file rows: what the worker does
};

const std::vector<Row>& Table() {
  static const std::vector<Row> rows = {
      // --- command lines -----------------------------------------------------------------------
      {"cli", {"--nproc_per_node=0", "@W"}, {}, 2, "invalid value '0' for --nproc_per_node"},
      {"cli", {"--nproc_per_node=-1", "@W"}, {}, 2, "invalid value '-1' for --nproc_per_node"},
      {"cli", {"--nproc_per_node=abc", "@W"}, {}, 2, "expected an integer >= 1, cpu, gpu or auto"},
      {"cli", {"--nproc_per_node=xpu", "@W"}, {}, 2, "'xpu' devices are not supported"},
      {"cli", {"--nproc_per_node=100000000", "@W"}, {}, 2, "--nproc_per_node=100000000 is more workers than"},
      {"cli", {"--nproc_per_node=99999999999999999999", "@W"}, {}, 2, "for --nproc_per_node"},
      {"cli", {"--nnodes=0", "@W"}, {}, 2, "the number of nodes must be >= 1"},
      {"cli", {"--nnodes=3:2", "@W"}, {}, 2, "MIN (3) must not exceed MAX (2)"},
      {"cli", {"--nnodes=a:b", "@W"}, {}, 2, "expected N or MIN:MAX"},
      {"cli", {"--nnodes=1:2", "@W"}, {}, 2, "the static rendezvous needs a fixed node count"},
      {"cli", {"--max_restarts=-1", "@W"}, {}, 2, "invalid value '-1' for --max_restarts: must be >= 0"},
      {"cli", {"--max_restarts=abc", "@W"}, {}, 2, "for --max_restarts: not an integer"},
      {"cli", {"--max_restarts=99999999999999999999", "@W"}, {}, 2, "integer out of range"},
      {"cli", {"--bogus-flag", "@W"}, {}, 2, "unrecognized option '--bogus-flag'"},
      {"cli", {"--standalone"}, {}, 2, "missing the entrypoint"},
      {"cli", {"--"}, {}, 2, "missing the entrypoint"},
      {"cli", {"--node_rank=-1", "@W"}, {}, 2, "--node_rank"},
      {"cli", {"--nnodes=2", "--node_rank=2", "@W"}, {}, 2, "--node_rank=2 is out of range for --nnodes=2"},
      {"cli", {"--master_port=70000", "@W"}, {}, 2, "port must be in 1..65535"},
      {"cli", {"--master_port=0x", "@W"}, {}, 2, "expected a port number (1-65535)"},
      {"cli", {"--master_addr=", "@W"}, {}, 2, "the address must not be empty"},
      {"cli", {"--run_path", "-m", "mod"}, {}, 2, "--run_path runs a script file through runpy.run_path: not together with -m"},
      {"cli", {"--logs-specs=mine", "@W"}, {}, 2, "no LogsSpecs plugin 'mine'"},
      {"cli", {"--numa-binding=node", "@W"}, {}, 2, "--numa-binding=node: local rank 0 has no GPU"},
      {"cli", {"--numa-binding=bogus", "@W"}, {}, 2, "--numa-binding"},
      {"cli", {"--cpu-binding=bogus", "@W"}, {}, 2, "--cpu-binding"},
      {"cli", {"--gpus=1-0", "@W"}, {}, 2, "--gpus"},
      {"cli", {"-m", "--no_python", "mod"}, {}, 2, "'--no-python' flag and the '--module'"},
      {"cli", {"--redirects=9", "@W"}, {}, 2, "--redirects: invalid value '9'"},
      {"cli", {"--tee=bad", "@W"}, {}, 2, "--tee: invalid value 'bad'"},
      {"cli", {"--redirects=0:5,0:1", "@W"}, {}, 2, "bad value '5', expected 0-3"},
      {"cli", {"--log-level=loud", "@W"}, {}, 2, "invalid value 'loud' for --log-level"},
      {"cli", {"--local-ranks-filter=a", "@W"}, {}, 2, "--local-ranks-filter: invalid value 'a'"},
      {"cli", {"--ranks-filter=3-1", "@W"}, {}, 2, "--ranks-filter: invalid value '3-1'"},
      {"cli", {"--signals-to-handle=SIGFOO", "@W"}, {}, 2, "unknown signal 'SIGFOO'"},
      {"cli", {"--forward-signals=SIGKILL", "@W"}, {}, 2, "SIGKILL cannot be caught or forwarded"},
      {"cli", {"--shutdown-timeout=-1", "@W"}, {}, 2, "for --shutdown-timeout: must be >= 0 seconds"},
      {"cli", {"--shutdown-timeout=nan", "@W"}, {}, 2, "for --shutdown-timeout: not a finite number"},
      {"cli", {"--monitor_interval=-1", "@W"}, {}, 2, "for --monitor_interval: must be > 0"},
      // A time past ~9.2e9 s no longer fits the clocks' nanoseconds: it was a time already past
      // (--max-run-time fired at once, --shutdown-timeout gave no grace).
      {"cli", {"--max-run-time=1e10", "@W"}, {}, 2, "for --max-run-time: must be at most 1e9 seconds (about 31 years)"},
      {"cli", {"--shutdown-timeout=1e10", "@W"}, {}, 2, "for --shutdown-timeout: must be at most 1e9 seconds"},
      {"cli", {"--restart-backoff=1e30", "@W"}, {}, 2, "for --restart-backoff: must be at most 1e9 seconds"},
      {"cli", {"--late-exit-notice=-1", "@W"}, {}, 2, "for --late-exit-notice: must be >= 0 seconds"},
      {"cli", {"--late-exit-notice=soon", "@W"}, {}, 2, "--late-exit-notice"},
      {"cli", {"@W"}, {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT=1e10"}, 2, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT: must be at most 1e9"},
      {"cli", {"--start_method=thread", "@W"}, {}, 2, "expected spawn, fork or forkserver"},
      {"cli", {"--virtual-local-rank=1", "@W"}, {}, 2, "option --virtual-local-rank takes no value"},
      {"cli", {"--standalone=yes", "@W"}, {}, 2, "option --standalone takes no value"},
      {"cli", {"--log-prefix=${bogus}", "@W"}, {}, 2, "unknown placeholder '$bogus'"},
      {"cli", {"--summary-file=/nonexistent/dir/s.json", "@W"}, {}, 2, "cannot write --summary-file /nonexistent/dir/s.json"},
      {"cli", {"/nonexistent/prog"}, {}, 2, "cannot execute /nonexistent/prog: No such file or directory"},
      {"cli", {"train.py"}, {"PYTHON_EXEC=/nonexistent/python"}, 2,
       "cannot execute /nonexistent/python: No such file or directory (the interpreter PYTHON_EXEC names)"},
      {"cli", {"/etc/ld.so.cache"}, {}, 2, "cannot execute /etc/ld.so.cache: Permission denied"},
      {"cli", {"/tmp"}, {}, 2, "cannot execute /tmp: is a directory"},
      {"cli", {"/dev/null"}, {}, 2, "cannot execute /dev/null: not a regular file"},
      {"cli", {"--log_dir=/proc/forbidden", "@W"}, {}, 1, "cannot create the log directory: mkdir -p /proc/forbidden"},
      {"cli", {"--log_dir=/etc/passwd", "@W"}, {}, 1, "cannot create the log directory: mkdir -p /etc/passwd"},
      {"cli", {"--redirects=3", "--log_dir=/dev/null", "@W"}, {}, 2,
       "--redirects 3 with --log_dir /dev/null: the redirected worker output would be discarded"},
      {"cli", {"--redirects=0:1", "--tee=0:2", "--log_dir=/dev/null", "@W"}, {}, 2,
       "--redirects 0:1 with --log_dir /dev/null"},
      {"env", {"@W"}, {"PET_REDIRECTS=2", "PET_LOG_DIR=/dev/null"}, 2, "--redirects 2 with --log_dir /dev/null"},
      // --- environment values ------------------------------------------------------------------
      {"env", {"@W"}, {"PET_NPROC_PER_NODE=zero"}, 2, "invalid value 'zero' for PET_NPROC_PER_NODE"},
      {"env", {"@W"}, {"PET_NNODES=2:1"}, 2, "invalid value '2:1' for PET_NNODES"},
      {"env", {"--standalone", "@W"}, {"PET_NNODES=2"}, 2, "--standalone runs a single node, but PET_NNODES=2 asks for more"},
      {"env", {"@W"}, {"PET_MAX_RESTARTS=-3"}, 2, "invalid value '-3' for PET_MAX_RESTARTS"},
      {"env", {"@W"}, {"PET_STANDALONE=maybe"}, 2, "invalid value 'maybe' for PET_STANDALONE: expected 0 or 1"},
      {"env", {"@W"}, {"PET_RDZV_BACKEND=foo"}, 2, "invalid value 'foo' for PET_RDZV_BACKEND"},
      {"env", {"@W"}, {"PET_RDZV_CONF=bar=1"}, 2, "--rdzv_conf: unknown key 'bar'"},
      {"env", {"@W"}, {"PET_MASTER_PORT=abc"}, 2, "invalid value 'abc' for PET_MASTER_PORT"},
      {"env", {"@W"}, {"PET_NODE_RANK=x"}, 2, "invalid value 'x' for PET_NODE_RANK: not an integer"},
      {"env", {"@W"}, {"PET_TEE=7"}, 2, "--tee: invalid value '7'"},
      {"env", {"@W"}, {"PET_REDIRECTS=x"}, 2, "--redirects: invalid value 'x'"},
      {"env", {"@W"}, {"PET_MONITOR_INTERVAL=0"}, 2, "invalid value '0' for PET_MONITOR_INTERVAL"},
      {"env", {"@W"}, {"PET_LOG_DIR=/proc/nope"}, 1, "cannot create the log directory: mkdir -p /proc/nope"},
      {"env", {"@W"}, {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT=soon"}, 2, "for TORCH_ELASTIC_SHUTDOWN_TIMEOUT: not a number"},
      {"env", {"@W"}, {"CTRUN_LOG_LEVEL=chatty"}, 2, "invalid value 'chatty' for CTRUN_LOG_LEVEL"},
      {"env", {"x.py"}, {"PYTHON_EXEC=/nonexistent/python"}, 2, "cannot execute /nonexistent/python"},
      // --- rendezvous configurations -----------------------------------------------------------
      {"rdzv", {"--rdzv_backend=zookeeper", "@W"}, {}, 2, "for --rdzv_backend: expected static, c10d, etcd or etcd-v2"},
      {"rdzv", {"--rdzv_conf=foo=1", "@W"}, {}, 2, "--rdzv_conf: unknown key 'foo'"},
      {"rdzv", {"--rdzv_conf=join_timeout=abc", "@W"}, {}, 2, "--rdzv_conf join_timeout=abc: expected a number of seconds: not a number"},
      {"rdzv", {"--rdzv_conf=join_timeout=-5", "@W"}, {}, 2, "--rdzv_conf join_timeout=-5: expected a number of seconds: must be > 0 seconds"},
      {"rdzv", {"--rdzv_conf=noequals", "@W"}, {}, 2, "option 'noequals' has no value"},
      {"rdzv", {"--rdzv_backend=c10d", "--nnodes=2", "--rdzv_endpoint=localhost:0", "@W"}, {}, 2,
       "--rdzv_endpoint=localhost:0: port 0 (any free port) works only for a single node (--nnodes=1)"},
      {"rdzv", {"--rdzv_backend=c10d", "--nnodes=2", "--rdzv_endpoint=localhost:70000", "@W"}, {}, 2,
       "--rdzv_endpoint=localhost:70000: bad port in 'localhost:70000' (expected 1-65535)"},
      {"rdzv", {"--rdzv_backend=c10d", "--nnodes=2", "--rdzv_endpoint=host:99999", "@W"}, {}, 2, "bad port in 'host:99999'"},
      {"rdzv", {"--rdzv_backend=c10d", "--nnodes=2", "--rdzv_endpoint=[::1", "@W"}, {}, 2, "unbalanced '[' in '[::1'"},
      {"rdzv", {"--rdzv_backend=etcd", "--nnodes=2", "--rdzv_endpoint=https://10.0.0.1:2379", "@W"}, {}, 2,
       "--rdzv_endpoint=https://10.0.0.1:2379: give HOST[:PORT] without a scheme (for TLS to etcd: --rdzv_conf protocol=https)"},
      {"rdzv", {"--rdzv_backend=c10d", "--nnodes=2", "@W"}, {"PET_RDZV_ENDPOINT=:"}, 2, "no host in ':'"},
      {"rdzv", {"--rdzv_backend=c10d", "--nnodes=2", "--rdzv_endpoint=localhost:1", "--rdzv_conf=is_host=maybe", "@W"}, {}, 2,
       "--rdzv_conf is_host=maybe: expected true/false, yes/no or 1/0"},
      {"rdzv", {"--rdzv_backend=c10d", "--nnodes=2", "--rdzv_endpoint=localhost:1", "--rdzv_conf=keep_alive_max_attempt=0", "@W"},
       {}, 2, "keep_alive_max_attempt=0: expected an integer from 1 to 1000"},
      {"rdzv", {"--rdzv_backend=c10d", "--nnodes=2", "--rdzv_endpoint=localhost:1", "--rdzv_conf=last_call_timeout=inf", "@W"},
       {}, 2, "last_call_timeout=inf: expected a number of seconds: "},
      {"rdzv", {"--rdzv_backend=etcd", "--nnodes=2", "--rdzv_endpoint=localhost:1", "--rdzv_conf=protocol=gopher", "@W"}, {}, 2,
       "protocol=gopher: expected http or https"},
      {"rdzv", {"--rdzv_backend=etcd", "--nnodes=2", "--rdzv_endpoint=localhost:1", "--rdzv_conf=cert=/nonexistent", "@W"}, {}, 2,
       "--rdzv_conf cert=/nonexistent: No such file or directory"},
      {"rdzv", {"--rdzv_backend=etcd-v2", "--nnodes=2", "--rdzv_endpoint=localhost:1", "--rdzv_conf=ssl_cert_key=/etc/hostname", "@W"}, {}, 2,
       "a client key (key, ssl_cert_key) needs its certificate (cert, ssl_cert)"},
      {"rdzv", {"--rdzv_backend=c10d", "--nnodes=2", "--rdzv_endpoint=localhost:1", "--rdzv_conf=store_type=file", "@W"}, {}, 2,
       "runs on its TCP store only"},
      {"rdzv", {"--rdzv_backend=c10d", "--nnodes=2", "--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_conf=join_timeout=1", "@W"}, {},
       3, "rendezvous timed out after 1 s"},
      // --- worker error files (the worker runs; ctrun reports the file and restarts as allowed) --
      {"error-file", {"--max_restarts=1", "@W"}, {}, 1, "(unreadable: invalid JSON", {"--error-raw", "{not json"}},
      {"error-file", {"--max_restarts=1", "@W"}, {}, 1, "(unreadable: not a JSON object)", {"--error-raw", "[1,2]"}},
      {"error-file", {"--max_restarts=1", "@W"}, {}, 1, "(unreadable: no \"message\" field)", {"--error-raw", "{\"msg\": 1}"}},
      {"error-file", {"--max_restarts=1", "@W"}, {}, 1, "(unreadable: \"message\" is neither a string nor an object)",
       {"--error-raw", "{\"message\": 5}"}},
      {"error-file", {"--max_restarts=1", "@W"}, {}, 1, "(unreadable: empty file)", {"--error-raw", "  \n "}},
      {"error-file", {"--max_restarts=1", "@W"}, {}, 1, "(unreadable: too large (2000000 bytes, limit 1048576))",
       {"--error-bytes", "2000000"}},
      {"error-file", {"--max_restarts=1", "@W"}, {}, 1, "error_file: <N/A>", {"--error-dir"}},
      {"error-file", {"--max_restarts=1", "@W"}, {}, 1, "traceback : boom",
       {"--error-raw", "{\"message\": {\"message\": \"boom\", \"extraInfo\": {\"timestamp\": \"notanumber\"}}}"}},
  };
  return rows;
}

std::string Replace(std::string s, const std::string& what, const std::string& with) {
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + with.size())) s.replace(p, what.size(), with);
  return s;
}

class BadInput : public ::testing::TestWithParam<size_t> {};

TEST_P(BadInput, RejectedWithItsCodeAndMessage) {
  const Row& row = Table()[GetParam()];
  TempDir dir;
  const std::string marker = NewJobMarker();
  const std::string port = std::to_string(ctrun::testing::FreePort());
  const bool worker_runs = std::string(row.kind) == "error-file";
  std::vector<std::string> argv{CTRUN_BINARY};
  if (worker_runs) argv.push_back("--standalone");  // a free port: other tests run at the same time
  for (const std::string& f : row.flags) {
    if (f == "@W") {
      argv.push_back(FAKE_WORKER);
      argv.insert(argv.end(), {"--touch", dir.path(), "--pid-file", dir / "pids", "--exit", "1"});
      argv.insert(argv.end(), row.worker_args.begin(), row.worker_args.end());
    } else {
      argv.push_back(Replace(f, "{port}", port));
    }
  }
  std::vector<std::string> env = row.env;
  env.push_back(MarkerEnv(marker));
  env.push_back("TMPDIR=" + dir.path());  // ctrun's default log dir lands here, not in /tmp
  RunResult r = RunCommand(argv, env, 30s);
  std::string shown;
  for (const auto& a : argv) shown += a + " ";
  ASSERT_NE(r.exit_code, -1) << "hung: " << shown;
  EXPECT_EQ(r.exit_code, row.exit_code) << shown << "\n" << r.err;
  EXPECT_NE(r.err.find(row.message), std::string::npos) << shown << "\nexpected: " << row.message << "\ngot: " << r.err;
  if (row.exit_code == 2) {
    const auto lines = SplitLines(r.err);
    ASSERT_EQ(lines.size(), 1u) << r.err;
    EXPECT_EQ(lines[0].rfind("ctrun: error: ", 0), 0u) << r.err;
  }
  if (worker_runs) {
    // --max_restarts=1: two attempts of one worker, no more (no restart loop).
    EXPECT_EQ(ctrun::testing::ReadPids(dir / "pids").size(), 2u) << r.err;
  } else {
    EXPECT_FALSE(std::filesystem::exists(dir / "0")) << "a worker started: " << shown;
  }
  EXPECT_EQ(WaitJobGone(marker), std::vector<pid_t>{}) << Describe(ProcessesOfJob(marker));
}

INSTANTIATE_TEST_SUITE_P(Table, BadInput, ::testing::Range<size_t>(0, Table().size()),
                         [](const ::testing::TestParamInfo<size_t>& p) {
                           const std::string kind = Table()[p.param].kind;
                           return (kind == "error-file" ? std::string("error_file") : kind) + "_" +
                                  std::to_string(p.param);
                         });

// --- snapshot files (worker library) ------------------------------------------------------------

struct SnapRow {
  const char* name;
  std::function<void(std::string*)> corrupt;  // applied to a valid snapshot file's bytes
  std::string reason;
};

void PutU64(std::string* b, size_t off, uint64_t v) { std::memcpy(b->data() + off, &v, sizeof v); }

// Sets the header's flags and raw length and recomputes both checksums, as a crafted file would.
void Reseal(std::string* b, uint32_t flags, uint64_t raw_len) {
  std::memcpy(b->data() + 12, &flags, 4);
  PutU64(b, 32, raw_len);
  const uint32_t payload = ctrun::worker::crc32c(b->data() + 64, b->size() - 64);
  std::memcpy(b->data() + 48, &payload, 4);
  const uint32_t header = ctrun::worker::crc32c(b->data(), 56);
  std::memcpy(b->data() + 56, &header, 4);
}

TEST(BadSnapshot, EveryCorruptFileIsRejectedWithItsReasonAndTheOlderOneLoads) {
  const std::vector<SnapRow> rows = {
      {"empty", [](std::string* b) { b->clear(); }, "truncated header (0 bytes)"},
      {"short", [](std::string* b) { b->resize(10); }, "truncated header (10 bytes)"},
      {"bad magic", [](std::string* b) { (*b)[0] = 'X'; }, "bad magic"},
      {"header bit flip", [](std::string* b) { (*b)[20] ^= 1; }, "header checksum mismatch"},
      {"header crc zeroed", [](std::string* b) { PutU64(b, 56, 0); }, "header checksum mismatch"},
      {"payload bit flip", [](std::string* b) { (*b)[b->size() - 1] ^= 0x40; }, "payload checksum mismatch"},
      {"truncated payload", [](std::string* b) { b->resize(b->size() - 3); }, "length mismatch"},
      {"trailing garbage", [](std::string* b) { b->append("junk"); }, "length mismatch"},
      {"all zeros", [](std::string* b) { std::fill(b->begin(), b->end(), '\0'); }, "bad magic"},
      // Valid checksums around a crafted zstd raw length of 2^60 (found by fuzz/snapshot_header_fuzz.cc:
      // the reader used to resize a buffer to it and throw std::length_error out of a no-throw API).
      {"zstd raw length 2^60", [](std::string* b) { Reseal(b, /*flags=*/1, /*raw_len=*/1ULL << 60); },
       "raw length 1152921504606846976 impossible"},
      {"zstd flag on raw bytes", [](std::string* b) { Reseal(b, /*flags=*/1, /*raw_len=*/300); },
       "decompressed length mismatch"},
  };
  TempDir dir;
  size_t rejected = 0;
  for (const SnapRow& row : rows) {
    const std::string sub = dir / ("s" + std::to_string(rejected));
    ctrun::worker::SnapshotOptions o;
    o.dir = sub;
    o.fsync = false;
    o.keep_last = 5;
    ctrun::worker::SnapshotStore store(o);
    const std::string payload(300, 'p');
    store.save(10, payload.data(), payload.size());
    const std::string newest = store.save(20, payload.data(), payload.size());
    std::string bytes = ReadFileOr(newest);
    row.corrupt(&bytes);
    std::ofstream(newest, std::ios::binary | std::ios::trunc) << bytes;
    const std::string why = ctrun::worker::verify_snapshot_file(newest);
    EXPECT_NE(why.find(row.reason), std::string::npos) << row.name << ": " << why;
    auto loaded = store.load_latest();
    ASSERT_TRUE(loaded.snapshot.has_value()) << row.name;
    EXPECT_EQ(loaded.snapshot->step, 10u) << row.name;
    ASSERT_EQ(loaded.skipped.size(), 1u) << row.name;
    EXPECT_NE(loaded.skipped[0].find(row.reason), std::string::npos) << row.name << ": " << loaded.skipped[0];
    if (!why.empty()) ++rejected;
  }
  EXPECT_EQ(rejected, rows.size());
  std::printf("[reliability] bad snapshot files tried: %zu, rejected: %zu\n", rows.size(), rejected);
}

// --- store messages ------------------------------------------------------------------------------

std::string U64(uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), sizeof v); }
std::string Str(const std::string& s) { return U64(s.size()) + s; }
const std::string kValidate = std::string("\0", 1) + std::string("\xCE\xF7\x85\x3C", 4);

struct StoreRow {
  const char* name;
  std::string bytes;
  std::string message;  // in ctrun's "store: ..." line for this connection
};

// True when the server closes the connection within `ms` (reads until EOF).
bool ClosedByServer(int fd, int ms) {
  char buf[256];
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
  }
  return false;
}

TEST(BadStoreMessage, EveryMalformedMessageClosesItsConnectionAndTheJobGoesOn) {
  const std::vector<StoreRow> rows = {
      {"not a TCPStore client", std::string("\xC8hello", 6), "unrecognised first byte 200"},
      {"legacy SET, 1 TiB key", std::string(1, '\0') + U64(1ULL << 40), "declared size over the limit"},
      {"modern, unknown query", kValidate + std::string(1, '\x63'), "unknown query type 99 in the modern"},
      {"modern, VALIDATE twice", kValidate + kValidate, "VALIDATE is only accepted as the first query"},
      {"legacy CHECK, 2^50 keys", std::string(1, '\x04') + U64(1ULL << 50), "declared size over the limit"},
      {"legacy MULTI_SET, 2^40 pairs", std::string(1, '\x0B') + U64(1ULL << 40), "declared size over the limit"},
      {"AUTH after a request", std::string(1, '\x06') + std::string(1, '\xF5'), "unknown query type 245 in the legacy"},
      {"legacy ADD on a non-number", std::string(1, '\0') + Str("relk") + Str("abc") + std::string(1, '\x03') + Str("relk") +
                                         U64(1),
       "ADD on non-numeric key 'relk'"},
      {"modern APPEND, huge value", kValidate + std::string(1, '\x09') + Str("k") + U64(1ULL << 62),
       "declared size over the limit"},
  };
  TempDir dir;
  const std::string marker = NewJobMarker();
  BackgroundProcess job({CTRUN_BINARY, "--standalone", "--nproc_per_node=1", FAKE_WORKER, "--env-file", dir / "env",
                         "--wait-file", dir / "go"},
                        {MarkerEnv(marker), "TMPDIR=" + dir.path()}, dir / "out", dir / "err");
  ASSERT_TRUE(WaitFor([&] { return !ReadEnvFile(dir / "env.0")["MASTER_PORT"].empty(); }, 20s)) << ReadFileOr(dir / "err");
  const int port = std::stoi(ReadEnvFile(dir / "env.0")["MASTER_PORT"]);
  auto store_lines = [&] {
    std::vector<std::string> out;
    for (const auto& l : SplitLines(ReadFileOr(dir / "err")))
      if (l.find("store: ") != std::string::npos) out.push_back(l);
    return out;
  };
  size_t rejected = 0, lines_before = store_lines().size();
  for (const StoreRow& row : rows) {
    int fd = ConnectLoopback(port);
    ASSERT_GE(fd, 0) << row.name;
    ASSERT_EQ(::send(fd, row.bytes.data(), row.bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(row.bytes.size()));
    const bool closed = ClosedByServer(fd, 5000);
    ::close(fd);
    EXPECT_TRUE(closed) << row.name << ": the store kept the connection";
    std::vector<std::string> lines;
    ASSERT_TRUE(WaitFor([&] { return (lines = store_lines()).size() > lines_before; }, 5s)) << row.name;
    EXPECT_EQ(lines.size(), lines_before + 1) << row.name;
    EXPECT_NE(lines.back().find(row.message), std::string::npos) << row.name << ": " << lines.back();
    lines_before = lines.size();
    if (closed) ++rejected;
  }
  // A client that repeats the same mistake (an HTTP client retrying at the store's port) is
  // warned about once: the repeat is closed as well, at the debug level only.
  {
    int fd = ConnectLoopback(port);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::send(fd, rows[0].bytes.data(), rows[0].bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(rows[0].bytes.size()));
    EXPECT_TRUE(ClosedByServer(fd, 5000)) << "the repeat";
    ::close(fd);
    EXPECT_EQ(store_lines().size(), lines_before) << "the repeat was warned about again";
  }
  std::ofstream(dir / "go").put('1');
  EXPECT_EQ(job.Wait(30s), 0) << ReadFileOr(dir / "err");
  EXPECT_EQ(WaitJobGone(marker), std::vector<pid_t>{});
  EXPECT_EQ(rejected, rows.size());
  std::printf("[reliability] bad store messages tried: %zu, rejected: %zu\n", rows.size(), rejected);
}

TEST(BadInputTable, Size) {
  // The table above plus the snapshot and store rows; the README's figure comes from this line.
  std::printf("[reliability] bad command lines/environment/rdzv/error files in the table: %zu\n", Table().size());
  EXPECT_GE(Table().size(), 60u);
}

}  // namespace
}  // namespace ctrun::reliability
