#include "ctrun/snapshot_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <cstdio>
#include <memory>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>

#include "atomic_file.h"
#include "base/unique_fd.h"
#include "crc32c.h"
#include "sys/posix_util.h"
#include "sys/safe_path.h"

#if CTRUN_WORKER_HAVE_ZSTD
#include <zstd.h>
#endif

namespace ctrun::worker {
namespace {

constexpr char kMagic[8] = {'C', 'T', 'S', 'N', 'A', 'P', '0', '1'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kFlagZstd = 1;
constexpr size_t kHeaderSize = 64;
constexpr size_t kHeaderCrcOffset = 56;
constexpr const char* kFilePrefix = "snapshot-";
constexpr const char* kFileSuffix = ".ctsnap";
// How long a temp file of another host (or without a host in its name) must go unmodified
// before a store opening the directory takes it for a dead writer's (see the constructor).
constexpr std::chrono::hours kForeignTempAge{1};

// Little-endian field access (the header is defined little-endian; x86_64/aarch64 are LE).
template <typename T>
void Put(unsigned char* h, size_t off, T v) {
  std::memcpy(h + off, &v, sizeof v);
}
template <typename T>
T Get(const unsigned char* h, size_t off) {
  T v;
  std::memcpy(&v, h + off, sizeof v);
  return v;
}

struct Header {
  uint32_t flags = 0;
  uint64_t step = 0;
  uint64_t stored_len = 0;
  uint64_t raw_len = 0;
  uint64_t created_ns = 0;
  uint32_t payload_crc = 0;
};

void EncodeHeader(const Header& hd, unsigned char* h) {
  std::memset(h, 0, kHeaderSize);
  std::memcpy(h, kMagic, 8);
  Put<uint32_t>(h, 8, kVersion);
  Put<uint32_t>(h, 12, hd.flags);
  Put<uint64_t>(h, 16, hd.step);
  Put<uint64_t>(h, 24, hd.stored_len);
  Put<uint64_t>(h, 32, hd.raw_len);
  Put<uint64_t>(h, 40, hd.created_ns);
  Put<uint32_t>(h, 48, hd.payload_crc);
  Put<uint32_t>(h, kHeaderCrcOffset, crc32c(h, kHeaderCrcOffset));
}

// Error text, or empty when the header is well formed.
std::string DecodeHeader(const unsigned char* h, Header* hd) {
  if (std::memcmp(h, kMagic, 8) != 0) return "bad magic";
  if (Get<uint32_t>(h, kHeaderCrcOffset) != crc32c(h, kHeaderCrcOffset)) return "header checksum mismatch";
  uint32_t version = Get<uint32_t>(h, 8);
  if (version != kVersion) return "unsupported version " + std::to_string(version);
  hd->flags = Get<uint32_t>(h, 12);
  if ((hd->flags & ~kFlagZstd) != 0) return "unknown flags";
  hd->step = Get<uint64_t>(h, 16);
  hd->stored_len = Get<uint64_t>(h, 24);
  hd->raw_len = Get<uint64_t>(h, 32);
  hd->created_ns = Get<uint64_t>(h, 40);
  hd->payload_crc = Get<uint32_t>(h, 48);
  return {};
}

bool ReadExactly(int fd, void* buf, size_t n, off_t off) {
  auto* p = static_cast<unsigned char*>(buf);
  while (n > 0) {
    ssize_t r = RetryOnEintr([&] { return ::pread(fd, p, n, off); });
    if (r <= 0) return false;
    p += r;
    off += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

std::optional<uint64_t> StepFromName(const std::string& name) {
  const size_t pl = std::strlen(kFilePrefix);
  const size_t sl = std::strlen(kFileSuffix);
  if (name.size() != pl + 20 + sl || name.compare(0, pl, kFilePrefix) != 0 ||
      name.compare(pl + 20, sl, kFileSuffix) != 0) {
    return std::nullopt;
  }
  uint64_t step = 0;
  const char* b = name.data() + pl;
  auto [p, ec] = std::from_chars(b, b + 20, step);
  if (ec != std::errc() || p != b + 20) return std::nullopt;
  return step;
}

// The writer a temp file of a snapshot name records (atomic_file.h), or nullopt for any other name.
std::optional<TempWriter> SnapshotTempWriter(const std::string& name) {
  const size_t tl = std::strlen(kTempPrefix);
  const size_t target_len = std::strlen(kFilePrefix) + 20 + std::strlen(kFileSuffix);
  if (name.size() <= tl + target_len + 1 || name.compare(0, tl, kTempPrefix) != 0 || name[tl + target_len] != '-' ||
      !StepFromName(name.substr(tl, target_len))) {
    return std::nullopt;
  }
  return parse_temp_writer(std::string_view(name).substr(tl + target_len + 1));
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  struct CloseDir {
    void operator()(DIR* d) const { ::closedir(d); }
  };
  std::unique_ptr<DIR, CloseDir> d(::opendir(dir.c_str()));
  if (!d) {
    if (errno == ENOENT) return names;
    throw SnapshotError("opendir " + dir + ": " + std::strerror(errno));
  }
  while (dirent* e = ::readdir(d.get())) names.emplace_back(e->d_name);
  return names;
}

uint64_t NowUnixNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace

bool snapshot_compression_available() { return CTRUN_WORKER_HAVE_ZSTD != 0; }

namespace {

// Opens a candidate file for reading without ever blocking or following a link: a FIFO with a
// snapshot name would block a plain open() until some writer appears (forever), and a symlink
// could point anywhere. Returns an error text (the file is not a snapshot), or empty with *fd and
// *size set for a regular file. O_NONBLOCK has no effect on reads of a regular file.
std::string OpenRegular(const std::string& path, UniqueFd* fd, uint64_t* size) {
  const int raw = RetryOnEintr([&] { return ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC); });
  if (raw < 0) {
    if (errno == ELOOP) return "not a regular file (symbolic link, not followed)";
    return std::string("open: ") + std::strerror(errno);
  }
  fd->reset(raw);
  struct stat st {};
  if (::fstat(fd->get(), &st) != 0) return std::string("stat: ") + std::strerror(errno);
  if (!S_ISREG(st.st_mode)) {
    const char* kind = S_ISDIR(st.st_mode) ? "directory" : S_ISFIFO(st.st_mode) ? "FIFO"
                       : S_ISSOCK(st.st_mode) ? "socket" : "device";
    fd->reset();
    return std::string("not a regular file (") + kind + ")";
  }
  *size = static_cast<uint64_t>(st.st_size);
  return {};
}

// Reads and checks the header of an open regular file of `size` bytes: magic, header CRC,
// version, flags, and a file length that matches the stored length. Error text, or empty.
std::string ReadHeader(int fd, uint64_t size, Header* hd) {
  if (size < kHeaderSize) return "truncated header (" + std::to_string(size) + " bytes)";
  unsigned char h[kHeaderSize];
  if (!ReadExactly(fd, h, kHeaderSize, 0)) return "short read of header";
  if (std::string e = DecodeHeader(h, hd); !e.empty()) return e;
  if (size != kHeaderSize + hd->stored_len) {
    return "length mismatch: file has " + std::to_string(size - kHeaderSize) + " payload bytes, header says " +
           std::to_string(hd->stored_len);
  }
  return {};
}

// Whether the file named for `step` looks like a valid snapshot by a cheap check (64 bytes read,
// no payload CRC): a regular file, a well-formed header of that step and the exact length.
// Retention counts only these, without reading gigabytes per save.
bool LooksValid(const std::string& path, uint64_t step) {
  UniqueFd fd;
  uint64_t size = 0;
  Header hd;
  return OpenRegular(path, &fd, &size).empty() && ReadHeader(fd.get(), size, &hd).empty() && hd.step == step;
}

#if CTRUN_WORKER_HAVE_ZSTD
// Decompresses `stored`, one zstd frame, into *raw, which must come out at exactly raw_len bytes
// (the header's length, equal to the frame's content size, both from the file). That length is
// within the bound of what the stored bytes could inflate to, but that bound is ~32768 times the
// file: a crafted frame could claim terabytes for a megabyte. So the output is allocated as it
// is really produced: raw_len at once only when it is at most kFirstOutput or twice the stored
// length (a snapshot that compresses up to 2:1, the common case, decompresses in one call into
// its final buffer), otherwise starting there and doubling, never past raw_len. A frame that
// yields more or fewer bytes than raw_len, is truncated or has bytes after it is rejected.
std::string Decompress(const std::vector<std::byte>& stored, uint64_t raw_len, std::vector<std::byte>* raw) {
  constexpr uint64_t kFirstOutput = uint64_t{1} << 20;
  const uint64_t first = std::max<uint64_t>(kFirstOutput, stored.size() * uint64_t{2});
  const auto mismatch = [&](const std::string& got) {
    return "decompressed length mismatch: the zstd frame holds " + got + " bytes, the header says " +
           std::to_string(raw_len);
  };
  if (raw_len <= first) {
    raw->resize(raw_len);
    const size_t r = ZSTD_decompress(raw->data(), raw->size(), stored.data(), stored.size());
    if (ZSTD_isError(r)) return std::string("zstd: ") + ZSTD_getErrorName(r);
    if (r != raw_len) return mismatch(std::to_string(r));
    return {};
  }
  std::unique_ptr<ZSTD_DCtx, decltype(&ZSTD_freeDCtx)> dctx(ZSTD_createDCtx(), &ZSTD_freeDCtx);
  if (!dctx) throw std::bad_alloc();
  raw->resize(first);
  ZSTD_inBuffer in{stored.data(), stored.size(), 0};
  size_t produced = 0;
  bool complete = false;
  while (!complete) {
    if (produced == raw->size()) {
      if (raw->size() == raw_len) break;  // all raw_len bytes are out
      raw->resize(std::min<uint64_t>(raw_len, raw->size() * uint64_t{2}));
    }
    ZSTD_outBuffer out{raw->data(), raw->size(), produced};
    const size_t in_before = in.pos;
    const size_t r = ZSTD_decompressStream(dctx.get(), &out, &in);
    if (ZSTD_isError(r)) return std::string("zstd: ") + ZSTD_getErrorName(r);
    const bool progress = out.pos != produced || in.pos != in_before;
    produced = out.pos;
    complete = r == 0;
    if (!complete && !progress) return "truncated zstd frame";
  }
  // All raw_len bytes are out but the frame has not ended yet: it must end without a byte more.
  while (!complete) {
    std::byte extra{};
    ZSTD_outBuffer out{&extra, 1, 0};
    const size_t in_before = in.pos;
    const size_t r = ZSTD_decompressStream(dctx.get(), &out, &in);
    if (ZSTD_isError(r)) return std::string("zstd: ") + ZSTD_getErrorName(r);
    if (out.pos != 0) return mismatch("more than " + std::to_string(raw_len));
    complete = r == 0;
    if (!complete && in.pos == in_before) return "truncated zstd frame";
  }
  if (in.pos != in.size) return "bytes after the zstd frame";
  if (produced != raw_len) return mismatch(std::to_string(produced));
  return {};
}
#endif

}  // namespace

std::string verify_snapshot_file(const std::string& path, std::vector<std::byte>* data_out,
                                 uint64_t* step_out) {
  UniqueFd fd;
  uint64_t size = 0;
  if (std::string e = OpenRegular(path, &fd, &size); !e.empty()) return e;
  Header hd;
  if (std::string e = ReadHeader(fd.get(), size, &hd); !e.empty()) return e;
  std::vector<std::byte> stored(hd.stored_len);
  if (!ReadExactly(fd.get(), stored.data(), stored.size(), kHeaderSize)) return "short read of payload";
  if (crc32c(stored.data(), stored.size()) != hd.payload_crc) return "payload checksum mismatch";
  std::vector<std::byte> raw;
  if (hd.flags & kFlagZstd) {
#if CTRUN_WORKER_HAVE_ZSTD
    // The raw length comes from the file. A zstd block inflates to at most 128 KiB and takes at
    // least 4 stored bytes (an RLE block), so a larger raw length is corrupt or crafted; and
    // save() always records the length in the frame. Decompress allocates only as the frame
    // really yields bytes, since this bound is far above any real snapshot's length.
    if (hd.raw_len > (hd.stored_len / 4 + 1) * (128u << 10))
      return "raw length " + std::to_string(hd.raw_len) + " impossible for " + std::to_string(hd.stored_len) +
             " zstd bytes";
    if (ZSTD_getFrameContentSize(stored.data(), stored.size()) != hd.raw_len) return "decompressed length mismatch";
    if (std::string e = Decompress(stored, hd.raw_len, &raw); !e.empty()) return e;
#else
    return "zstd-compressed snapshot, but ctrun_worker was built without zstd";
#endif
  } else {
    if (hd.raw_len != hd.stored_len) return "raw length mismatch";
    raw = std::move(stored);
  }
  if (step_out) *step_out = hd.step;
  if (data_out) *data_out = std::move(raw);
  return {};
}

// The background writer: one thread, one job slot. The caller hands over a buffer; the thread
// compresses, checksums, writes and fsyncs it, then records success or the exception.
struct SnapshotStore::Async {
  std::mutex mu;
  std::condition_variable cv;
  bool has_job = false;
  bool stop = false;
  uint64_t step = 0;
  std::vector<std::byte> data;
  std::vector<std::byte> spare;  // the last written buffer, handed back by take_buffer()
  std::exception_ptr error;
  std::thread thread;
};

SnapshotStore::SnapshotStore(SnapshotOptions options) : options_(std::move(options)) {
  if (options_.dir.empty()) throw SnapshotError("SnapshotOptions::dir is empty");
  if (options_.keep_last < 1) throw SnapshotError("SnapshotOptions::keep_last must be >= 1");
#if !CTRUN_WORKER_HAVE_ZSTD
  if (options_.zstd_level != 0) throw SnapshotError("zstd compression requested, but built without zstd");
#endif
  if (std::string why = PlantedSymlink(options_.dir); !why.empty())
    throw SnapshotError("snapshot directory " + options_.dir + " not followed: " + why);
  // Durable like the snapshots it will hold: each directory created here is fsync'ed into its
  // parent (wait() promises a durable snapshot, which needs its directory's entry too).
  if (std::string err = make_dirs(options_.dir, options_.fsync); !err.empty())
    throw SnapshotError("create " + options_.dir + ": " + err);
  // Temp files of writers that died mid-save (".tmp-snapshot-<step>.ctsnap-<host>-<pid>-<n>").
  // Only a pid of this host (the same host token) can be checked, and only a writer known to be
  // gone loses its file now: kill() failing with ESRCH. EPERM is a live writer of another user.
  // Our own pid is ours only while we write it; otherwise it is a dead writer's that had our pid
  // (a restarted container's fresh pid namespace). The temp of another host (a shared
  // filesystem: this store may be an evaluator's on another node, its pids not ours to check) or
  // of the older name without a host goes only once unmodified for kForeignTempAge: a writer
  // changes its file as it writes it and renames it right after the last write, so an hour
  // without a change is a dead writer (or one stopped for that long, whose save then fails).
  const auto now = std::chrono::system_clock::now();
  for (const std::string& name : ListDir(options_.dir)) {
    const std::optional<TempWriter> writer = SnapshotTempWriter(name);
    if (!writer) continue;
    const std::string path = options_.dir + "/" + name;
    if (writer->host == temp_host_token()) {
      const bool alive = writer->pid == ::getpid() ? temp_in_flight(path)
                                                   : ::kill(writer->pid, 0) == 0 || errno != ESRCH;
      if (alive) continue;
    } else {
      struct stat st {};
      if (::lstat(path.c_str(), &st) != 0) continue;
      const auto modified = std::chrono::system_clock::from_time_t(st.st_mtim.tv_sec);
      if (now - modified < kForeignTempAge) continue;  // (a second's precision is plenty here)
    }
    ::unlink(path.c_str());
  }
}

SnapshotStore::~SnapshotStore() {
  if (!async_) return;
  {
    std::unique_lock lock(async_->mu);
    async_->cv.wait(lock, [&] { return !async_->has_job; });
    async_->stop = true;
  }
  async_->cv.notify_all();
  // async_ is only ever set with a running thread (save_async); the check keeps join() from
  // throwing out of this noexcept destructor should that ever change.
  if (async_->thread.joinable()) async_->thread.join();
}

std::string SnapshotStore::path_for(uint64_t step) const {
  char name[64];
  std::snprintf(name, sizeof name, "%s%020llu%s", kFilePrefix, static_cast<unsigned long long>(step),
                kFileSuffix);
  return options_.dir + "/" + name;
}

void SnapshotStore::write_now(uint64_t step, const void* data, size_t size) {
  Header hd;
  hd.step = step;
  hd.raw_len = size;
  hd.created_ns = NowUnixNs();
  const void* stored = data;
  size_t stored_len = size;
  std::vector<std::byte> compressed;
#if CTRUN_WORKER_HAVE_ZSTD
  if (options_.zstd_level != 0) {
    std::unique_ptr<ZSTD_CCtx, decltype(&ZSTD_freeCCtx)> cctx(ZSTD_createCCtx(), &ZSTD_freeCCtx);
    if (!cctx) throw SnapshotError("ZSTD_createCCtx failed");
    ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_compressionLevel, options_.zstd_level);
    ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_contentSizeFlag, 1);
    if (options_.zstd_workers > 0) {
      ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_nbWorkers, options_.zstd_workers);  // ignored if no MT
    }
    compressed.resize(ZSTD_compressBound(size));
    size_t r = ZSTD_compress2(cctx.get(), compressed.data(), compressed.size(), data, size);
    if (ZSTD_isError(r)) throw SnapshotError(std::string("zstd: ") + ZSTD_getErrorName(r));
    compressed.resize(r);
    stored = compressed.data();
    stored_len = r;
    hd.flags |= kFlagZstd;
  }
#endif
  hd.stored_len = stored_len;
  hd.payload_crc = crc32c(stored, stored_len);
  unsigned char h[kHeaderSize];
  EncodeHeader(hd, h);
  std::string err = write_file_atomic(path_for(step), {{h, kHeaderSize}, {stored, stored_len}},
                                      options_.fsync);
  if (!err.empty()) throw SnapshotError("snapshot save: " + err);
  prune(step);
}

// Retention after the save of `step`, whose file is durable by now. Steps above it are an
// abandoned future (the run went back to `step`: a fresh start, or a resume from an older
// snapshot): a later resume must find `step`, not them, so they go, and their removal is made
// durable before the save counts as done. Of the older steps the newest keep_last - 1 VALID ones
// stay (LooksValid: a corrupt file, a link, a directory or a FIFO with a snapshot name does not
// count), and every name below the oldest of them goes, valid or not. An invalid name between
// kept ones stays until it falls below them (a load reports it). With fewer valid ones than
// that, nothing older goes. The file just written is never a candidate. unlink() leaves a
// directory of a snapshot name in place.
void SnapshotStore::prune(uint64_t step) {
  discard_newer(step);
  std::vector<uint64_t> older;
  for (uint64_t s : list_steps())
    if (s < step) older.push_back(s);  // ascending
  size_t wanted = static_cast<size_t>(options_.keep_last) - 1;
  size_t first_kept = older.size();  // names below this index go
  for (size_t i = older.size(); i-- > 0 && wanted > 0;) {
    if (LooksValid(path_for(older[i]), older[i])) {
      first_kept = i;
      --wanted;
    }
  }
  if (wanted > 0) first_kept = 0;  // fewer valid ones than keep_last - 1: keep all
  for (size_t i = 0; i < first_kept; ++i) ::unlink(path_for(older[i]).c_str());
}

void SnapshotStore::discard_newer(std::optional<uint64_t> step) {
  bool removed = false;
  for (uint64_t s : list_steps())
    if (!step || s > *step) removed |= ::unlink(path_for(s).c_str()) == 0;
  if (removed && options_.fsync) {
    if (std::string err = fsync_dir(options_.dir); !err.empty()) throw SnapshotError("snapshot: " + err);
  }
}

std::string SnapshotStore::save(uint64_t step, const void* data, size_t size) {
  wait();
  write_now(step, data, size);
  return path_for(step);
}

void SnapshotStore::save_async(uint64_t step, std::vector<std::byte> data) {
  if (!async_) {
    // The writer is built and started in a local and published only once its thread runs: a
    // thread that cannot start (EAGAIN under a pids or RLIMIT_NPROC limit) must not leave a store
    // whose queued jobs no thread takes (wait(), save() and the destructor would block for ever).
    // The thread only uses `a`, which the move into async_ does not relocate.
    auto fresh = std::make_unique<Async>();
    Async* a = fresh.get();
    try {
      a->thread = std::thread([this, a] {
        std::unique_lock lock(a->mu);
        for (;;) {
          a->cv.wait(lock, [&] { return a->has_job || a->stop; });
          if (a->has_job) {
            const uint64_t job_step = a->step;
            std::vector<std::byte> job = std::move(a->data);
            lock.unlock();
            std::exception_ptr err;
            try {
              write_now(job_step, job.data(), job.size());
            } catch (...) {
              err = std::current_exception();
            }
            lock.lock();
            a->spare = std::move(job);  // keep the pages for the caller's next snapshot
            if (err && !a->error) a->error = err;
            a->has_job = false;
            a->cv.notify_all();
          } else if (a->stop) {
            return;
          }
        }
      });
    } catch (const std::system_error& e) {
      // Nothing was queued: `data` is dropped, and the next save_async tries to start one again.
      throw SnapshotError(std::string("snapshot save_async: cannot start the background writer thread: ") +
                          e.code().message());
    }
    async_ = std::move(fresh);
  }
  wait();  // at most one in flight; also surfaces the previous save's error
  {
    std::lock_guard lock(async_->mu);
    async_->step = step;
    async_->data = std::move(data);
    async_->has_job = true;
  }
  async_->cv.notify_all();
}

void SnapshotStore::wait() {
  if (!async_) return;
  std::unique_lock lock(async_->mu);
  async_->cv.wait(lock, [&] { return !async_->has_job; });
  if (async_->error) std::rethrow_exception(std::exchange(async_->error, nullptr));
}

std::vector<std::byte> SnapshotStore::take_buffer() {
  if (!async_) return {};
  std::lock_guard lock(async_->mu);
  return std::exchange(async_->spare, {});
}

bool SnapshotStore::busy() const {
  if (!async_) return false;
  std::lock_guard lock(async_->mu);
  return async_->has_job;
}

std::vector<uint64_t> SnapshotStore::list_steps() const {
  std::vector<uint64_t> steps;
  for (const std::string& name : ListDir(options_.dir)) {
    if (auto s = StepFromName(name)) steps.push_back(*s);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

std::optional<Snapshot> SnapshotStore::load(uint64_t step) const {
  Snapshot s;
  s.path = path_for(step);
  uint64_t header_step = 0;
  if (!verify_snapshot_file(s.path, &s.data, &header_step).empty() || header_step != step) {
    return std::nullopt;
  }
  s.step = step;
  return s;
}

LoadResult SnapshotStore::load_latest(std::optional<uint64_t> max_step) const {
  LoadResult result;
  std::vector<uint64_t> steps = list_steps();
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    if (max_step && *it > *max_step) continue;
    Snapshot s;
    s.path = path_for(*it);
    uint64_t header_step = 0;
    std::string why = verify_snapshot_file(s.path, &s.data, &header_step);
    if (why.empty() && header_step != *it) why = "header step " + std::to_string(header_step) + " != name";
    if (!why.empty()) {
      result.skipped.push_back(s.path + ": " + why);
      continue;
    }
    s.step = *it;
    result.snapshot = std::move(s);
    break;
  }
  return result;
}

}  // namespace ctrun::worker
