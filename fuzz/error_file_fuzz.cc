// libFuzzer target for the error-file reader (src/report/error_file.cc): a worker writes that file,
// so its bytes are untrusted. The input becomes the file's contents (a memfd, read through
// /proc/self/fd). Checked properties (a violation traps):
//  - reading never crashes, throws, leaks or reads out of bounds (ASan/UBSan);
//  - a file that reads is within the size cap and its traceback is never empty;
//  - a file that does not read has a reason.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "report/error_file.h"

namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int fd = ::memfd_create("error_file_fuzz", MFD_CLOEXEC);
  if (fd < 0) return 0;
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) return 0;
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  // A small cap so the fuzzer also reaches the "too large" path.
  auto r = ctrun::ReadErrorFile(path, /*max_bytes=*/4096);
  if (r.ok()) {
    Check(size <= 4096);
    if (r->has_value()) Check(!(*r)->traceback.empty());
  } else {
    Check(!r.message().empty());
  }
  return 0;
}
