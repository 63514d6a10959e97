// CurlLoop: HTTP POSTs through libcurl's multi interface, driven by ctrun's EventLoop. No thread of
// ours and no blocking call: curl's sockets are registered with the loop (CURLMOPT_SOCKETFUNCTION)
// and its single timeout is one loop timer (CURLMOPT_TIMERFUNCTION); readiness and the timer call
// curl_multi_socket_action, and finished transfers are collected with curl_multi_info_read.
//
// Contract:
//  - Every callback runs on the loop's thread, from a loop handler, never inside Post/Stream/
//    Cancel. A callback may start, cancel, or destroy (the CurlLoop itself included).
//  - Cancel(id) and ~CurlLoop are final: the transfer's callbacks never run afterwards.
//  - A transfer fails (HttpResult::error) only when no HTTP response arrived complete: connect
//    refused, TLS failure, timeout, a connection cut mid-body. Any HTTP status is a response.
//  - Sockets are opened SOCK_CLOEXEC (CURLOPT_OPENSOCKETFUNCTION); signals are never used
//    (CURLOPT_NOSIGNAL). The process must ignore SIGPIPE, as the agent does (sys/signals.h).
//  - Proxies are never used (http_proxy and friends are ignored): the peers are cluster-internal.
//  - Host names go through curl's threaded resolver (one short-lived thread per lookup, which
//    never forks); IP literals are used as they are, with no thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "sys/event_loop.h"

namespace ctrun::rdzv {

// Files for https:// (PEM). Empty fields use curl's defaults (the system CA bundle, no client cert).
struct TlsFiles {
  std::string ca_file;    // CURLOPT_CAINFO
  std::string cert_file;  // CURLOPT_SSLCERT
  std::string key_file;   // CURLOPT_SSLKEY
};

struct HttpRequest {
  std::string url;
  std::string body;                  // sent as the POST body
  std::vector<std::string> headers;  // "Name: value"
  Duration timeout{};                // the whole transfer; zero: no limit (streams)
  Duration connect_timeout = Seconds(5);
  TlsFiles tls;
};

// A transfer's outcome. `error` is set when no complete response arrived (status is 0 then);
// `permanent` marks failures that retrying cannot fix (TLS files or verification, bad URL).
struct HttpResult {
  Status error;
  bool permanent = false;
  long status = 0;   // HTTP status code
  std::string body;  // the whole body (for a 2xx stream: empty, it went to on_data)
};

class CurlLoop {
 public:
  using TransferId = uint64_t;
  using DoneCallback = std::function<void(HttpResult)>;
  using DataCallback = std::function<void(std::string_view chunk)>;

  // Aborts the process when libcurl cannot be initialised (out of memory at start-up).
  // Precondition: LoadCurl() (curl_api.h) succeeded; the owner reports its error to the user.
  explicit CurlLoop(EventLoop* loop);
  ~CurlLoop();
  CurlLoop(const CurlLoop&) = delete;
  CurlLoop& operator=(const CurlLoop&) = delete;

  // A request/response POST: done gets the whole response.
  TransferId Post(HttpRequest request, DoneCallback done);
  // A streaming POST: while the response is 2xx, on_data gets the body in chunks as they arrive
  // (in order, from loop handlers); done runs once at the end (a body that is not 2xx arrives
  // whole in done instead).
  TransferId Stream(HttpRequest request, DataCallback on_data, DoneCallback done);
  // Aborts the transfer; its callbacks never run. Unknown or finished ids are ignored.
  void Cancel(TransferId id);

  size_t active() const { return transfers_.size(); }

 private:
  struct Transfer;
  struct MultiDeleter {
    void operator()(void* multi) const;
  };

  TransferId Start(HttpRequest request, DataCallback on_data, DoneCallback done);
  Status Configure(Transfer& t, const HttpRequest& request);
  void FailLater(Transfer& t, Status why);  // done(why) from a loop timer

  friend struct CurlCallbacks;  // libcurl's C callbacks (curl_loop.cc)

  // Runs curl on `fd` (or its timeout), then hands out data and completions.
  void Drive(int fd, int ev_bitmask);
  void CollectFinished();  // no user code runs here
  void Dispatch();         // user callbacks; returns early when *this is destroyed meanwhile
  void ScheduleDispatch();

  EventLoop* loop_;
  std::unique_ptr<void, MultiDeleter> multi_;
  std::map<TransferId, std::unique_ptr<Transfer>> transfers_;
  std::set<int> fds_;  // sockets registered with the loop
  std::vector<TransferId> have_data_;
  std::vector<TransferId> finished_;
  TimerQueue::TimerId curl_timer_ = 0;
  TimerQueue::TimerId dispatch_timer_ = 0;
  TransferId next_id_ = 1;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace ctrun::rdzv
