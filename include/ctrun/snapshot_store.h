// ctrun/snapshot_store.h — crash-safe, versioned snapshots of opaque bytes in one directory.
//
// Contract
//  - save(step, bytes) writes "<dir>/snapshot-<step, 20 digits>.ctsnap" atomically: the data goes
//    to a temp file in the same directory (".tmp-snapshot-<step, 20 digits>.ctsnap-<host>-<pid>-<n>",
//    <host> being this host's name with each byte outside [A-Za-z0-9._-] as '_'), is fsync'ed, renamed
//    over the final name, and the directory is fsync'ed. A reader never sees a partial final file;
//    a crash (even SIGKILL or power loss after the fsync) leaves either the old set or the new set.
//    Directories the constructor creates (mkdir -p of dir) are fsync'ed into their parents at
//    creation, so a durable snapshot's directory is durable too.
//  - Each file is a 64-byte header (magic "CTSNAP01", version, flags, step, stored length, raw
//    length, CRC32C of the stored bytes, CRC32C of the header) followed by the stored bytes (raw,
//    or one zstd frame when compression is on). docs/worker-library.md has the byte layout.
//  - Retention, after a successful save of step s: snapshots of steps above s are removed (the run
//    went back to s, by a fresh start or a resume from an older snapshot, so they are an
//    abandoned future that a later resume must not prefer to s; their removal is durable when
//    the save is). Of the steps below s the newest keep_last - 1 valid snapshots are kept, so
//    with the new one the newest keep_last valid snapshots remain; every name below the oldest
//    kept one is removed, valid or not. "Valid" here is a cheap check that reads 64 bytes: a
//    regular file (not a symlink, directory or FIFO) whose header decodes (magic, version,
//    flags, header CRC) with its name's step and whose length matches; the payload CRC is only
//    checked by loads. Invalid names between kept snapshots stay (loads report them) and do not
//    count; with fewer valid snapshots than keep_last, no older name is removed; a directory of a
//    snapshot name is never removed. The snapshot just written is never removed by its own
//    save's retention.
//  - discard_newer(step) removes the snapshots above `step` (every one when nullopt), durably
//    when fsync is on, before it returns: what a resume calls once the ranks agreed on `step`
//    (or on a fresh start), so that no rank keeps a newer snapshot of the abandoned run. Kept, it
//    could be agreed on later, after a save of the same step that only some ranks finished, and
//    those ranks would resume from different runs.
//  - Temp files left by dead writers of this directory are removed when a store opens it: at once
//    for a writer of this host (same <host>) whose pid is gone (kill(pid, 0) fails with ESRCH; a
//    live pid of another user is left alone); a temp of another host (a shared filesystem, where
//    an evaluator on another node may open a rank's store) or without a host in its name (an
//    older version's) only once it has not been modified for an hour, since its pid cannot be
//    checked here. Writers that share a host name must share a pid namespace (containers with
//    the host's name and their own pids are not told apart).
//  - load_latest() returns the snapshot with the highest step that passes every check (header
//    CRC, exact file length, payload CRC, decompressed length); corrupt or torn files are skipped
//    (listed in LoadResult::skipped, never deleted by a load) and the next older one is tried.
//    A name that is not a regular file (a FIFO, directory, socket, device or symbolic link) is
//    skipped the same way: candidates are opened O_NONBLOCK|O_NOFOLLOW and checked with fstat
//    before any read, so a FIFO never blocks a load and a link is never followed.
//    load_latest(max_step) only considers steps <= max_step (used by ranks agreeing on a step).
//  - save_async(step, bytes) takes ownership of the buffer and returns at once when no save is in
//    flight; with one in flight it first waits for it (double buffering: at most one buffer being
//    written while the caller fills the next). wait() blocks until the in-flight save is durable
//    and rethrows its error, if any. The destructor waits too (errors are then swallowed).
//    take_buffer() hands back the last written buffer for reuse (true double buffering: one
//    buffer being written, one being filled; the store holds at most these two).
//  - Errors: save/save_async/wait throw SnapshotError (I/O failures, with errno text). Loads do
//    not throw for bad files, only for an unreadable directory, or std::bad_alloc when memory
//    runs out for a file's bytes (what it stores, or decompressed as much as the zstd frame
//    really yields: a crafted length costs no memory). That file may be valid, so it is not
//    skipped: a resume from an older one would let the next save remove it. The first
//    save_async also throws SnapshotError when the background thread cannot start (EAGAIN
//    under a pids limit): that buffer is not saved, the store stays usable (save() works), and
//    the next save_async tries to start the thread again.
//  - One writer per directory (give each rank its own directory). Not safe to share one
//    SnapshotStore between threads except as documented (save_async runs the write on one
//    background thread owned by the store).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace ctrun::worker {

class SnapshotError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct SnapshotOptions {
  std::string dir;              // created (with parents) if missing; each directory created is
                                // fsync'ed into its parent (unless fsync is false)
  int keep_last = 3;            // >= 1
  int zstd_level = 0;           // 0: store raw; 1..19: zstd (throws if built without zstd)
  int zstd_workers = 0;         // zstd multithreading (0: single-threaded)
  bool fsync = true;            // false only for benchmarks/tests on throwaway dirs
};

struct Snapshot {
  uint64_t step = 0;
  std::vector<std::byte> data;  // uncompressed payload
  std::string path;
};

struct LoadResult {
  std::optional<Snapshot> snapshot;       // newest valid one, if any
  std::vector<std::string> skipped;       // "path: reason" for each rejected newer file
};

// Why a file is rejected, or empty when it is valid. Exposed for tests and tools.
std::string verify_snapshot_file(const std::string& path, std::vector<std::byte>* data_out = nullptr,
                                 uint64_t* step_out = nullptr);
bool snapshot_compression_available();

class SnapshotStore {
 public:
  explicit SnapshotStore(SnapshotOptions options);
  ~SnapshotStore();
  SnapshotStore(const SnapshotStore&) = delete;
  SnapshotStore& operator=(const SnapshotStore&) = delete;

  const SnapshotOptions& options() const { return options_; }

  // Synchronous save; returns the final path. Waits for an in-flight async save first.
  std::string save(uint64_t step, const void* data, size_t size);
  std::string save(uint64_t step, const std::vector<std::byte>& data) {
    return save(step, data.data(), data.size());
  }
  void save_async(uint64_t step, std::vector<std::byte> data);
  // The buffer of the last finished async save (size and pages intact), or an empty vector:
  // filling it instead of a fresh vector avoids re-faulting hundreds of MB per snapshot.
  std::vector<std::byte> take_buffer();
  void wait();
  bool busy() const;

  // Steps of the final-named files present, ascending (not verified).
  std::vector<uint64_t> list_steps() const;
  LoadResult load_latest(std::optional<uint64_t> max_step = std::nullopt) const;
  std::optional<Snapshot> load(uint64_t step) const;
  std::string path_for(uint64_t step) const;
  // Removes every snapshot above `step` (all of them when nullopt); see the contract above.
  void discard_newer(std::optional<uint64_t> step);

 private:
  struct Async;
  void write_now(uint64_t step, const void* data, size_t size);
  void prune(uint64_t step);

  SnapshotOptions options_;
  std::unique_ptr<Async> async_;
};

}  // namespace ctrun::worker
