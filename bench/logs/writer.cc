// ctrun_bench_writer BYTES [RANK [printf]]: writes at least BYTES of short numbered lines
// ("rank R line 0000000123 the quick brown fox\n", ~45 bytes) to stdout in 64 KiB writes.
// RANK defaults to $LOCAL_RANK. "printf" formats each line with stdio printf instead of the
// hand-rolled memcpy loop: closer to what a real program spends per line.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  long long total = std::strtoll(argv[1], nullptr, 10);
  const char* rank = argc > 2 ? argv[2] : (std::getenv("LOCAL_RANK") ? std::getenv("LOCAL_RANK") : "0");
  if (argc > 3 && std::strcmp(argv[3], "printf") == 0) {
    std::setvbuf(stdout, nullptr, _IOFBF, 1 << 16);
    long long written = 0;
    for (long long i = 0; written < total; ++i) {
      int n = std::printf("rank %s line %010lld the quick brown fox\n", rank, i);
      if (n < 0) return 1;
      written += n;
    }
    return std::fflush(stdout) == 0 ? 0 : 1;
  }
  std::string head = std::string("rank ") + rank + " line ";
  static const char kTail[] = " the quick brown fox\n";
  static char buf[1 << 16];
  size_t used = 0;
  long long written = 0;
  char num[10];
  std::memset(num, '0', sizeof num);
  while (written < total) {
    size_t len = head.size() + sizeof num + sizeof kTail - 1;
    if (used + len > sizeof buf) {
      for (size_t off = 0; off < used;) {
        ssize_t n = ::write(1, buf + off, used - off);
        if (n <= 0) return 1;
        off += static_cast<size_t>(n);
      }
      written += static_cast<long long>(used);
      used = 0;
    }
    std::memcpy(buf + used, head.data(), head.size());
    std::memcpy(buf + used + head.size(), num, sizeof num);
    std::memcpy(buf + used + head.size() + sizeof num, kTail, sizeof kTail - 1);
    used += len;
    for (int i = sizeof num - 1; i >= 0 && ++num[i] > '9'; --i) num[i] = '0';  // increment
  }
  return 0;
}
