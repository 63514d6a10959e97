#include "rendezvous/curl_loop.h"

#include "rendezvous/curl_api.h"

#include <sys/socket.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <utility>

namespace ctrun::rdzv {
namespace {

// A response body larger than this fails the transfer (etcd answers are far smaller).
constexpr size_t kMaxBody = 64u << 20;

struct EasyDeleter {
  void operator()(CURL* easy) const { Curl().easy_cleanup(easy); }
};
struct SlistDeleter {
  void operator()(curl_slist* list) const { Curl().slist_free_all(list); }
};

long Ms(Duration d) { return static_cast<long>(std::chrono::ceil<std::chrono::milliseconds>(d).count()); }

bool Is2xx(long status) { return status >= 200 && status < 300; }

// Failures a retry cannot fix: the request or the TLS set-up itself is wrong.
bool IsPermanent(CURLcode rc) {
  switch (rc) {
    case CURLE_UNSUPPORTED_PROTOCOL:
    case CURLE_URL_MALFORMAT:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CRL_BADFILE:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
      return true;
    default:
      return false;
  }
}

}  // namespace

struct CurlLoop::Transfer {
  ~Transfer() {
    // Removing may call back into the owner (socket removal): the owner is alive while in_multi.
    if (in_multi) Curl().multi_remove_handle(owner->multi_.get(), easy.get());
  }

  CurlLoop* owner = nullptr;
  TransferId id = 0;
  std::string url;
  bool streaming = false;
  bool in_multi = false;
  bool too_big = false;
  DataCallback on_data;
  DoneCallback done;
  std::string body;     // whole body (request/response, or a stream's non-2xx answer)
  std::string pending;  // a 2xx stream's bytes not yet handed to on_data
  std::optional<HttpResult> result;  // set once finished
  char error[CURL_ERROR_SIZE] = {};
  // Declared before `easy`: the header list must outlive the handle that points at it.
  std::unique_ptr<curl_slist, SlistDeleter> headers;
  std::unique_ptr<CURL, EasyDeleter> easy;
};

// The C callbacks libcurl calls; each gets the CurlLoop (or Transfer) through its user pointer.
// They run inside curl calls, so they only record work; user callbacks run later in Dispatch().
struct CurlCallbacks {
  static int Socket(CURL*, curl_socket_t fd, int what, void* userp, void*) {
    auto* self = static_cast<CurlLoop*>(userp);
    EventLoop* loop = self->loop_;
    if (what == CURL_POLL_REMOVE) {
      if (self->fds_.erase(fd)) loop->RemoveFd(fd);
      return 0;
    }
    uint32_t events = 0;
    if (what & CURL_POLL_IN) events |= EPOLLIN;
    if (what & CURL_POLL_OUT) events |= EPOLLOUT;
    if (self->fds_.count(fd) && loop->ModifyFd(fd, events).ok()) return 0;
    // New, or a number curl closed and reopened without telling us (epoll forgot it): re-add.
    loop->RemoveFd(fd);
    Status st = loop->AddFd(fd, events, [self, fd](uint32_t ev) {
      int mask = 0;
      if (ev & (EPOLLIN | EPOLLHUP)) mask |= CURL_CSELECT_IN;
      if (ev & EPOLLOUT) mask |= CURL_CSELECT_OUT;
      if (ev & EPOLLERR) mask |= CURL_CSELECT_ERR;
      self->Drive(fd, mask);
    });
    if (!st.ok()) {
      self->fds_.erase(fd);
      return -1;
    }
    self->fds_.insert(fd);
    return 0;
  }

  // curl's single timeout: -1 cancels it, 0 means "as soon as possible". Never drive curl from
  // here (we are inside a curl call): a loop timer does it.
  static int Timer(CURLM*, long timeout_ms, void* userp) {
    auto* self = static_cast<CurlLoop*>(userp);
    if (self->curl_timer_) self->loop_->CancelTimer(self->curl_timer_);
    self->curl_timer_ = 0;
    if (timeout_ms >= 0) {
      self->curl_timer_ = self->loop_->AddTimerAfter(std::chrono::milliseconds(timeout_ms), [self] {
        self->curl_timer_ = 0;
        self->Drive(CURL_SOCKET_TIMEOUT, 0);
      });
    }
    return 0;
  }

  static size_t Write(char* data, size_t size, size_t n, void* userp) {
    auto* t = static_cast<CurlLoop::Transfer*>(userp);
    const size_t len = size * n;
    long status = 0;
    Curl().easy_getinfo(t->easy.get(), CURLINFO_RESPONSE_CODE, &status);
    std::string& sink = t->streaming && Is2xx(status) ? t->pending : t->body;
    if (sink.size() + len > kMaxBody) {
      t->too_big = true;
      return 0;  // fails the transfer with CURLE_WRITE_ERROR
    }
    if (&sink == &t->pending && sink.empty()) t->owner->have_data_.push_back(t->id);
    sink.append(data, len);
    return len;
  }

  static curl_socket_t OpenSocket(void*, curlsocktype, curl_sockaddr* addr) {
    return ::socket(addr->family, addr->socktype | SOCK_CLOEXEC, addr->protocol);
  }
};

void CurlLoop::MultiDeleter::operator()(void* multi) const { Curl().multi_cleanup(multi); }

CurlLoop::CurlLoop(EventLoop* loop) : loop_(loop) {
  if (auto api = LoadCurl(); !api.ok()) {  // a broken precondition, not a run-time error
    std::fprintf(stderr, "ctrun: CurlLoop without libcurl: %s\n", api.message().c_str());
    std::abort();
  }
  multi_.reset(Curl().multi_init());
  if (!multi_) {
    std::fprintf(stderr, "ctrun: curl_multi_init failed\n");
    std::abort();
  }
  Curl().multi_setopt(multi_.get(), CURLMOPT_SOCKETFUNCTION, &CurlCallbacks::Socket);
  Curl().multi_setopt(multi_.get(), CURLMOPT_SOCKETDATA, this);
  Curl().multi_setopt(multi_.get(), CURLMOPT_TIMERFUNCTION, &CurlCallbacks::Timer);
  Curl().multi_setopt(multi_.get(), CURLMOPT_TIMERDATA, this);
}

CurlLoop::~CurlLoop() {
  alive_.reset();
  transfers_.clear();  // each leaves the multi handle first (curl may report socket removals)
  multi_.reset();      // closes cached connections
  for (int fd : fds_) loop_->RemoveFd(fd);
  if (curl_timer_) loop_->CancelTimer(curl_timer_);
  if (dispatch_timer_) loop_->CancelTimer(dispatch_timer_);
}

CurlLoop::TransferId CurlLoop::Post(HttpRequest request, DoneCallback done) {
  return Start(std::move(request), nullptr, std::move(done));
}

CurlLoop::TransferId CurlLoop::Stream(HttpRequest request, DataCallback on_data, DoneCallback done) {
  return Start(std::move(request), std::move(on_data), std::move(done));
}

CurlLoop::TransferId CurlLoop::Start(HttpRequest request, DataCallback on_data, DoneCallback done) {
  auto t = std::make_unique<Transfer>();
  t->owner = this;
  t->id = next_id_++;
  t->url = request.url;
  t->streaming = static_cast<bool>(on_data);
  t->on_data = std::move(on_data);
  t->done = std::move(done);
  Transfer& ref = *t;
  transfers_.emplace(ref.id, std::move(t));
  Status st = Configure(ref, request);
  if (st.ok() && Curl().multi_add_handle(multi_.get(), ref.easy.get()) != CURLM_OK)
    st = Status::Error("curl_multi_add_handle failed");
  if (st.ok()) {
    ref.in_multi = true;  // curl's timer callback now asks for a prompt first action
  } else {
    FailLater(ref, Status::Error("POST " + ref.url + ": " + st.message()));
  }
  return ref.id;
}

Status CurlLoop::Configure(Transfer& t, const HttpRequest& r) {
  t.easy.reset(Curl().easy_init());
  if (!t.easy) return Status::Error("curl_easy_init failed");
  curl_slist* list = Curl().slist_append(nullptr, "Expect:");  // no 100-continue round trip
  for (const auto& h : r.headers) {
    if (!list) break;
    curl_slist* grown = Curl().slist_append(list, h.c_str());
    if (!grown) Curl().slist_free_all(list);
    list = grown;
  }
  if (!list) return Status::Error("out of memory for headers");
  t.headers.reset(list);

  CURL* e = t.easy.get();
  CURLcode rc = CURLE_OK;
  auto set = [&rc](CURLcode c) {
    if (rc == CURLE_OK) rc = c;
  };
  set(Curl().easy_setopt(e, CURLOPT_URL, r.url.c_str()));
  set(RestrictToHttp(Curl(), e));
  set(Curl().easy_setopt(e, CURLOPT_PROXY, ""));  // never via http_proxy & co: etcd is cluster-internal
  set(Curl().easy_setopt(e, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1)));
  set(Curl().easy_setopt(e, CURLOPT_POST, 1L));
  set(Curl().easy_setopt(e, CURLOPT_POSTFIELDSIZE, static_cast<long>(r.body.size())));
  set(Curl().easy_setopt(e, CURLOPT_COPYPOSTFIELDS, r.body.c_str()));
  set(Curl().easy_setopt(e, CURLOPT_HTTPHEADER, t.headers.get()));
  set(Curl().easy_setopt(e, CURLOPT_NOSIGNAL, 1L));
  set(Curl().easy_setopt(e, CURLOPT_OPENSOCKETFUNCTION, &CurlCallbacks::OpenSocket));
  set(Curl().easy_setopt(e, CURLOPT_WRITEFUNCTION, &CurlCallbacks::Write));
  set(Curl().easy_setopt(e, CURLOPT_WRITEDATA, &t));
  set(Curl().easy_setopt(e, CURLOPT_PRIVATE, &t));
  set(Curl().easy_setopt(e, CURLOPT_ERRORBUFFER, t.error));
  set(Curl().easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, Ms(r.connect_timeout)));
  if (r.timeout > Duration::zero()) set(Curl().easy_setopt(e, CURLOPT_TIMEOUT_MS, Ms(r.timeout)));
  // Long-lived streams notice a peer that vanished without closing (host down, partition).
  set(Curl().easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L));
  set(Curl().easy_setopt(e, CURLOPT_TCP_KEEPIDLE, 10L));
  set(Curl().easy_setopt(e, CURLOPT_TCP_KEEPINTVL, 5L));
  if (!r.tls.ca_file.empty()) set(Curl().easy_setopt(e, CURLOPT_CAINFO, r.tls.ca_file.c_str()));
  if (!r.tls.cert_file.empty()) set(Curl().easy_setopt(e, CURLOPT_SSLCERT, r.tls.cert_file.c_str()));
  if (!r.tls.key_file.empty()) set(Curl().easy_setopt(e, CURLOPT_SSLKEY, r.tls.key_file.c_str()));
  if (rc != CURLE_OK) return Status::Error(std::string("curl_easy_setopt: ") + Curl().easy_strerror(rc));
  return Status::Ok();
}

void CurlLoop::FailLater(Transfer& t, Status why) {
  t.result = HttpResult{std::move(why), true, 0, {}};
  finished_.push_back(t.id);
  ScheduleDispatch();
}

void CurlLoop::ScheduleDispatch() {
  if (dispatch_timer_) return;
  dispatch_timer_ = loop_->AddTimerAfter(Duration::zero(), [this] {
    dispatch_timer_ = 0;
    Dispatch();
  });
}

void CurlLoop::Cancel(TransferId id) {
  // Destroying the transfer removes it from the multi handle; ids queued in have_data_ or
  // finished_ no longer resolve, so its callbacks never run.
  transfers_.erase(id);
}

void CurlLoop::Drive(int fd, int ev_bitmask) {
  int running = 0;
  Curl().multi_socket_action(multi_.get(), fd, ev_bitmask, &running);
  CollectFinished();
  Dispatch();
}

void CurlLoop::CollectFinished() {
  int left = 0;
  while (CURLMsg* m = Curl().multi_info_read(multi_.get(), &left)) {
    if (m->msg != CURLMSG_DONE) continue;
    // Read the message before removing the handle: removal invalidates it.
    CURL* easy = m->easy_handle;
    const CURLcode rc = m->data.result;
    Transfer* t = nullptr;
    Curl().easy_getinfo(easy, CURLINFO_PRIVATE, reinterpret_cast<char**>(&t));
    Curl().multi_remove_handle(multi_.get(), easy);
    t->in_multi = false;
    if (rc == CURLE_OK) {
      long status = 0;
      Curl().easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
      t->result = HttpResult{Status::Ok(), false, status, std::move(t->body)};
    } else {
      std::string detail = t->too_big ? "response larger than 64 MiB"
                           : t->error[0] ? std::string(t->error)
                                         : std::string(Curl().easy_strerror(rc));
      t->result = HttpResult{Status::Error("POST " + t->url + ": " + detail), IsPermanent(rc), 0, {}};
    }
    finished_.push_back(t->id);
  }
}

void CurlLoop::Dispatch() {
  std::weak_ptr<bool> alive = alive_;
  // Stream data first: a stream's last chunk comes before its completion.
  for (TransferId id : std::exchange(have_data_, {})) {
    auto it = transfers_.find(id);
    if (it == transfers_.end() || it->second->pending.empty()) continue;
    std::string chunk = std::exchange(it->second->pending, {});
    DataCallback on_data = it->second->on_data;  // a copy: the callback may cancel its transfer
    on_data(chunk);
    if (alive.expired()) return;
  }
  for (TransferId id : std::exchange(finished_, {})) {
    auto it = transfers_.find(id);
    if (it == transfers_.end()) continue;
    std::unique_ptr<Transfer> t = std::move(it->second);
    transfers_.erase(it);
    t->done(std::move(*t->result));
    if (alive.expired()) return;
  }
}

}  // namespace ctrun::rdzv
