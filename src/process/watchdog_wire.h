/* The watchdog pipe's wire format, shared by ctrun (C++, process/watchdog.h) and the ct-watchdog
 * program (C, process/watchdog_helper.c), so that both read one definition. Plain C, no library:
 * the program is freestanding. */
#ifndef CTRUN_PROCESS_WATCHDOG_WIRE_H_
#define CTRUN_PROCESS_WATCHDOG_WIRE_H_

#include <stdint.h>

/* One message: 'A' (a process group to cover), 'R' (a group gone), 'Q' (clean shutdown: the EOF
 * that follows is no death), then the group id in the host's byte order. 5 bytes, below PIPE_BUF:
 * a write of one is atomic among all writers, so a reader never sees a torn one from a live
 * writer. */
struct WatchdogMessage {
  char op;
  int32_t pgid;
} __attribute__((packed));
#ifdef __cplusplus
static_assert(sizeof(struct WatchdogMessage) == 5, "the wire format");
#else
_Static_assert(sizeof(struct WatchdogMessage) == 5, "the wire format");
#endif

/* Process group ids are pids, and pids are below PID_MAX_LIMIT (4194304 on 64-bit Linux;
 * /proc/sys/kernel/pid_max cannot exceed it): a set of groups is one bit per id below this. */
enum { kWatchdogPidLimit = 4 << 20 };

#endif /* CTRUN_PROCESS_WATCHDOG_WIRE_H_ */
