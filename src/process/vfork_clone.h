// VforkClone: clone3(CLONE_VM | CLONE_VFORK) whose child runs a function on a stack of its own,
// the way posix_spawn makes children. No page tables or fd-table pages are copied (a fork of the
// agent copies its whole address space's page tables and then pays copy-on-write faults while the
// child runs), so its cost does not grow with the parent's size.
//
// Contract:
//  - The child shares the caller's memory until it execs or exits, and the calling thread is
//    suspended until then (CLONE_VFORK). The child must only read memory (its own stack aside)
//    and make system calls: no malloc, no locks, no stdio, nothing that touches glibc's per-thread
//    state but errno (the suspended caller's, harmless). `fn` must exec or _exit, never return.
//  - With share_files the child starts on the caller's fd table itself: every other thread of the
//    process may open and close descriptors in it until the child takes a table of its own, so
//    the child must read no descriptor but its own (held by the caller until the call returns).
//  - Only the calling thread waits: another thread of the process runs on. Whoever calls this
//    from a helper thread must keep that thread alive as long as the child lives, because
//    PR_SET_PDEATHSIG fires when the thread that created the child exits, not the process.
//  - `pidfd` and `pid` are written by the kernel before the child runs (CLONE_PIDFD,
//    CLONE_PARENT_SETTID), so another thread can learn who the child is while the caller is still
//    suspended (an exec stuck on a hung file system).
//  - Supported on x86-64 (a few instructions of assembly start the child on its stack: glibc
//    exports no clone3 wrapper); elsewhere, or on kernels without clone3 (< 5.3) or
//    CLONE_INTO_CGROUP (< 5.7), it fails with ENOSYS / E2BIG / EINVAL and the caller forks instead.
#pragma once

#include <sys/types.h>

#include <cstddef>

namespace ctrun {

// A stack for VforkClone's child: anonymous memory with a guard page below it. One child at a time
// (the creator is suspended while the child uses it), so a batch can reuse one.
class ChildStack {
 public:
  explicit ChildStack(size_t size);
  ~ChildStack();
  ChildStack(const ChildStack&) = delete;
  ChildStack& operator=(const ChildStack&) = delete;
  bool ok() const { return base_ != nullptr; }
  void* base() const { return base_; }  // lowest usable byte (above the guard page)
  size_t size() const { return size_; }

 private:
  void* mapping_ = nullptr;
  size_t mapping_size_ = 0;
  void* base_ = nullptr;
  size_t size_ = 0;
};

struct VforkCloneArgs {
  int cgroup_dir_fd = -1;  // >= 0: the child starts in that cgroup (CLONE_INTO_CGROUP)
  int* pidfd = nullptr;    // required: receives the child's pidfd (CLONE_PIDFD)
  pid_t* pid = nullptr;    // required: receives the child's pid (CLONE_PARENT_SETTID)
  // CLONE_FILES: the child shares the caller's fd table and must take its own before it changes
  // any descriptor (sys/high_fd.h: ChildUnshareBelowLine).
  bool share_files = false;
};

// Whether this build can make such a child at all (x86-64); the kernel may still refuse.
bool VforkCloneBuilt();

// Creates the child, which calls fn(arg) on `stack`; returns once the child has exec'd or exited:
// its pid, or -1 with errno (ENOSYS, E2BIG, EINVAL: the kernel cannot; the caller forks).
pid_t VforkClone(const VforkCloneArgs& args, ChildStack& stack, void (*fn)(void*), void* arg);

}  // namespace ctrun
