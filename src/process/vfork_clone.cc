#include "process/vfork_clone.h"

#include <linux/sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdint>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

namespace ctrun {

ChildStack::ChildStack(size_t size) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  size_ = (size + page - 1) / page * page;
  mapping_size_ = size_ + page;
  void* m = ::mmap(nullptr, mapping_size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (m == MAP_FAILED) return;
  mapping_ = m;
  if (::mprotect(mapping_, page, PROT_NONE) != 0) return;  // no guard page: treat as failure
  base_ = static_cast<char*>(mapping_) + page;
}

ChildStack::~ChildStack() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_size_);
}

#if defined(__x86_64__) && defined(SYS_clone3) && defined(CLONE_INTO_CGROUP)

bool VforkCloneBuilt() { return true; }

namespace {

// The raw clone3 system call. In the parent it returns what the kernel returned (pid or -errno).
// The child starts on args->stack + args->stack_size (16-byte aligned, so the call below leaves
// the stack as the ABI expects at a function's entry) with the parent's registers: fn and arg sit
// in callee-saved r12 and r13, which the kernel copies, and the child calls fn(arg), which never
// returns (ud2 traps if it did). rbp is cleared so that debuggers see the bottom of the child's
// stack.
long Clone3(clone_args* args, void (*fn)(void*), void* arg) {
  long ret;
  register void (*r12)(void*) asm("r12") = fn;
  register void* r13 asm("r13") = arg;
  asm volatile(
      "syscall\n\t"
      "testq %%rax, %%rax\n\t"
      "jnz 1f\n\t"
      "xorl %%ebp, %%ebp\n\t"
      "movq %%r13, %%rdi\n\t"
      "callq *%%r12\n\t"
      "ud2\n\t"
      "1:\n\t"
      : "=a"(ret)
      : "0"(static_cast<long>(SYS_clone3)), "D"(args), "S"(sizeof *args), "r"(r12), "r"(r13)
      : "rcx", "r11", "memory", "cc");
  return ret;
}

}  // namespace

pid_t VforkClone(const VforkCloneArgs& a, ChildStack& stack, void (*fn)(void*), void* arg) {
  if (!stack.ok() || a.pidfd == nullptr || a.pid == nullptr) {
    errno = EINVAL;
    return -1;
  }
  clone_args args{};
  args.flags = CLONE_VM | CLONE_VFORK | CLONE_PIDFD | CLONE_PARENT_SETTID;
  args.pidfd = reinterpret_cast<uintptr_t>(a.pidfd);
  args.parent_tid = reinterpret_cast<uintptr_t>(a.pid);
  args.exit_signal = SIGCHLD;
  args.stack = reinterpret_cast<uintptr_t>(stack.base());
  args.stack_size = stack.size() & ~static_cast<size_t>(15);
  if (a.share_files) args.flags |= CLONE_FILES;
  if (a.cgroup_dir_fd >= 0) {
    args.flags |= CLONE_INTO_CGROUP;
    args.cgroup = static_cast<uint64_t>(a.cgroup_dir_fd);
  }
  // Under AddressSanitizer the child's instrumented frames poison their redzones in the stack's
  // shadow and, never returning, never unpoison them: the next child on this stack would trip
  // over them.
#if defined(__SANITIZE_ADDRESS__)
  __asan_unpoison_memory_region(stack.base(), stack.size());
#endif
  const long r = Clone3(&args, fn, arg);
  if (r < 0) {
    errno = static_cast<int>(-r);
    return -1;
  }
  return static_cast<pid_t>(r);
}

#else

bool VforkCloneBuilt() { return false; }

pid_t VforkClone(const VforkCloneArgs&, ChildStack&, void (*)(void*), void*) {
  errno = ENOSYS;
  return -1;
}

#endif

}  // namespace ctrun
