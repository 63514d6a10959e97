#include "warm/native_opt_in.h"

#include <elf.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "base/unique_fd.h"
#include "ctrun/warm_main.h"

namespace ctrun::warm {
namespace {

constexpr size_t kMaxNotes = 1 << 16;  // a PT_NOTE segment larger than this is not ours to read
constexpr uint16_t kMaxHeaders = 256;

bool ReadAt(int fd, void* buf, size_t n, off_t at) {
  return ::pread(fd, buf, n, at) == static_cast<ssize_t>(n);
}

size_t Align4(size_t n) { return (n + 3) & ~size_t{3}; }

bool HasOurNote(const std::vector<char>& notes) {
  size_t at = 0;
  while (at + sizeof(Elf64_Nhdr) <= notes.size()) {
    Elf64_Nhdr h;
    std::memcpy(&h, notes.data() + at, sizeof h);
    const size_t name_at = at + sizeof h, desc_at = name_at + Align4(h.n_namesz);
    if (desc_at > notes.size() || desc_at + Align4(h.n_descsz) > notes.size()) return false;
    if (h.n_type == worker::kWarmNoteType && h.n_namesz == sizeof worker::kWarmNoteOwner &&
        std::memcmp(notes.data() + name_at, worker::kWarmNoteOwner, sizeof worker::kWarmNoteOwner) == 0 &&
        h.n_descsz == sizeof(uint32_t)) {
      uint32_t version;
      std::memcpy(&version, notes.data() + desc_at, sizeof version);
      return version == worker::kWarmProtocolVersion;
    }
    at = desc_at + Align4(h.n_descsz);
  }
  return false;
}

}  // namespace

bool OptsIntoWarm(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  Elf64_Ehdr eh;
  if (!fd || !ReadAt(fd.get(), &eh, sizeof eh, 0) || std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 ||
      eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phnum > kMaxHeaders)
    return false;
  for (uint16_t i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph;
    if (!ReadAt(fd.get(), &ph, sizeof ph, static_cast<off_t>(eh.e_phoff + i * sizeof ph))) return false;
    if (ph.p_type != PT_NOTE || ph.p_filesz > kMaxNotes) continue;
    std::vector<char> notes(ph.p_filesz);
    if (ReadAt(fd.get(), notes.data(), notes.size(), static_cast<off_t>(ph.p_offset)) && HasOurNote(notes))
      return true;
  }
  return false;
}

}  // namespace ctrun::warm
