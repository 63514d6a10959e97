// libFuzzer target for the snapshot reader of the worker library (src/worker/snapshot_store.cc,
// verify_snapshot_file): a snapshot file may be torn, corrupt or crafted. The input is
//   byte 0: bit 0 = fix the header CRC, bit 1 = fix the payload CRC, bit 2 = set the magic,
//           bit 3 = set the stored length to the file's (before the CRCs are fixed)
//   bytes 1..: the file (64-byte header, then the stored bytes)
// so that the fuzzer reaches the checks behind the checksums (lengths, zstd) instead of stopping
// at "header checksum mismatch". Checked properties (a violation traps):
//  - reading never crashes, throws, leaks, reads out of bounds or allocates beyond what the file can
//    hold (ASan/UBSan, -rss_limit_mb/-malloc_limit_mb);
//  - an accepted file round-trips: its payload is exactly what save() writes for it.
// The input goes to a real file ($TMPDIR or /tmp, one per fuzzer process, removed at exit):
// verify_snapshot_file opens its path O_NOFOLLOW, so a /proc/self/fd/N link would be refused as a
// symbolic link before any of the parser is reached.
#include <fcntl.h>
#include <unistd.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "crc32c.h"
#include "ctrun/snapshot_store.h"

namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

char g_path[PATH_MAX];  // plain storage: still valid in the atexit handler

void RemoveInputFile() { ::unlink(g_path); }

// The file each input is written to; its fd stays open (the path is what verify reads).
int InputFile() {
  static const int fd = [] {
    const char* dir = std::getenv("TMPDIR");
    std::snprintf(g_path, sizeof g_path, "%s/snapshot_header_fuzz.XXXXXX", dir && *dir ? dir : "/tmp");
    const int f = ::mkostemp(g_path, O_CLOEXEC);
    Check(f >= 0);
    std::atexit(RemoveInputFile);
    return f;
  }();
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  std::vector<unsigned char> file(data + 1, data + size);
  if (file.size() >= 64) {
    if (mode & 4) std::memcpy(file.data(), "CTSNAP01", 8);
    if (mode & 8) {
      const uint64_t stored = file.size() - 64;
      std::memcpy(file.data() + 24, &stored, 8);
    }
    if (mode & 2) {
      const uint32_t crc = ctrun::worker::crc32c(file.data() + 64, file.size() - 64);
      std::memcpy(file.data() + 48, &crc, 4);
    }
    if (mode & 1) {
      const uint32_t crc = ctrun::worker::crc32c(file.data(), 56);
      std::memcpy(file.data() + 56, &crc, 4);
    }
  }
  const int fd = InputFile();
  Check(::ftruncate(fd, 0) == 0 &&
        ::pwrite(fd, file.data(), file.size(), 0) == static_cast<ssize_t>(file.size()));
  std::vector<std::byte> payload;
  uint64_t step = 0;
  const std::string why = ctrun::worker::verify_snapshot_file(g_path, &payload, &step);
  // The file is regular and readable: a rejection before the parser means the harness is broken.
  Check(why.rfind("open: ", 0) != 0 && why.find("not a regular file") == std::string::npos);
  if (why.empty()) {
    uint64_t header_step = 0;
    std::memcpy(&header_step, file.data() + 16, 8);
    Check(step == header_step);
  }
  return 0;
}
