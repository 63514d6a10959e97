// Whether a binary opts into warm starts (CTRUN_MAIN, include/ctrun/warm_main.h): read from the
// file's ELF note before anything runs it. A binary without the note must be exec'd as usual:
// started as a warm server it would simply run as a plain worker.
#pragma once

#include <string>

namespace ctrun::warm {

// True when `path` is a 64-bit ELF file whose PT_NOTE segments hold the "ctrun" warm note with
// the protocol version this ctrun speaks. False for anything else (not ELF, no note, another
// version, unreadable); reads a few kilobytes at most.
bool OptsIntoWarm(const std::string& path);

}  // namespace ctrun::warm
