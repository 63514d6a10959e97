#include "process/spawn_thread.h"

#include <pthread.h>
#include <signal.h>

#include <condition_variable>
#include <mutex>
#include <memory>
#include <vector>

namespace ctrun {

struct SpawnThread::State {
  std::mutex mu;
  std::condition_variable cv;
  std::function<void()> job;  // the next job; empty when there is none
  bool done = true;           // the last job handed over has finished
};

namespace {

[[noreturn]] void Loop(std::shared_ptr<SpawnThread::State> s) {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(s->mu);
      s->cv.wait(lock, [&] { return static_cast<bool>(s->job); });
      job = std::move(s->job);
      s->job = nullptr;
    }
    job();
    job = nullptr;  // the job's captures go before `done`: nothing of it outlives the wait
    {
      std::lock_guard<std::mutex> lock(s->mu);
      s->done = true;
    }
    s->cv.notify_all();
  }
}

// Every spawn thread's handle, the usable one last: handles of abandoned threads stay reachable
// (their threads live on). `usable`: whether the last one may take jobs.
struct Threads {
  std::vector<std::unique_ptr<SpawnThread>> all;
  bool usable = false;
};

Threads& AllThreads() {
  static Threads* threads = new Threads();  // never destroyed: no static destructor can outlive it
  return *threads;
}

void* ThreadMain(void* arg) {
  std::unique_ptr<std::shared_ptr<SpawnThread::State>> s(static_cast<std::shared_ptr<SpawnThread::State>*>(arg));
  Loop(std::move(*s));
}

}  // namespace

SpawnThread::SpawnThread() : state_(std::make_shared<State>()) {}

bool SpawnThread::Start() {
  // Block everything before the thread exists, so it starts with every signal blocked.
  sigset_t all, old;
  ::sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  auto* arg = new std::shared_ptr<State>(state_);
  pthread_t t;
  const int err = ::pthread_create(&t, nullptr, ThreadMain, arg);
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (err != 0) {
    delete arg;
    return false;
  }
  ::pthread_detach(t);
  return true;
}

SpawnThread* SpawnThread::Current() {
  Threads& threads = AllThreads();
  if (!threads.usable) {
    auto fresh = std::unique_ptr<SpawnThread>(new SpawnThread());
    if (!fresh->Start()) return nullptr;
    threads.all.push_back(std::move(fresh));
    threads.usable = true;
  }
  return threads.all.back().get();
}

bool SpawnThread::Run(std::function<void()> job, TimePoint deadline) {
  Post(std::move(job));
  return Wait(deadline);
}

void SpawnThread::Post(std::function<void()> job) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->job = std::move(job);
  state_->done = false;
  state_->cv.notify_all();
}

bool SpawnThread::Wait(TimePoint deadline) {
  std::unique_lock<std::mutex> lock(state_->mu);
  if (state_->cv.wait_until(lock, deadline, [&] { return state_->done; })) return true;
  // Abandoned: the thread keeps `state_` (and the job) alive, and the next Current() starts a
  // fresh thread.
  AllThreads().usable = false;
  return false;
}

}  // namespace ctrun
