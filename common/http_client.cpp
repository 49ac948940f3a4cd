// libcurl multi client (see http_client.hpp).
#include "cpp_only.hpp"

#include "http_client.hpp"

#include <curl/curl.h>
#include <poll.h>

#include <algorithm>
#include <cctype>
#include <stdexcept>

namespace billguard {

namespace {

constexpr std::size_t kMaxResponseBytes = 1 << 20;

}  // namespace

// The sockets libcurl asks to be watched (CURL_POLL_IN, _OUT or _INOUT), as
// its socket callback reports them. Its timers are read with
// curl_multi_timeout.
struct HttpClient::Events {
  std::unordered_map<curl_socket_t, int> sockets;
  std::vector<pollfd> ready;  // reused by every Drive
  int running = 0;            // transfers libcurl has not finished
};

struct HttpClient::Transfer {
  CURL* easy = nullptr;
  curl_slist* headers = nullptr;
  HttpRequest request;
  HttpResponse response;
  char error[CURL_ERROR_SIZE] = {0};

  ~Transfer() {
    if (easy != nullptr) curl_easy_cleanup(easy);
    if (headers != nullptr) curl_slist_free_all(headers);
  }
};

namespace {

size_t OnBody(char* data, size_t size, size_t count, void* user) {
  auto* response = static_cast<HttpResponse*>(user);
  const size_t bytes = size * count;
  const size_t room = kMaxResponseBytes - std::min(kMaxResponseBytes, response->body.size());
  response->body.append(data, std::min(bytes, room));
  return bytes;
}

// Keeps the few response headers the Stripe protocol needs.
size_t OnHeader(char* data, size_t size, size_t count, void* user) {
  auto* response = static_cast<HttpResponse*>(user);
  const size_t bytes = size * count;
  std::string line(data, bytes);
  const auto colon = line.find(':');
  if (colon == std::string::npos) return bytes;
  std::string name = line.substr(0, colon);
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  std::string value = line.substr(colon + 1);
  const auto first = value.find_first_not_of(" \t");
  const auto last = value.find_last_not_of(" \t\r\n");
  value = first == std::string::npos ? "" : value.substr(first, last - first + 1);
  if (name == "idempotent-replayed") response->idempotent_replayed = value;
  if (name == "stripe-should-retry") response->should_retry = value;
  if (name == "request-id") response->request_id = value;
  return bytes;
}

// Whether a failed transfer provably sent no byte of its request: the name
// did not resolve or no connection was made, and no request was written on
// any connection of the transfer (libcurl re-sends on a fresh connection
// when a reused one dies, and that fresh connect may then be refused). A
// timeout proves nothing: the same code ends a transfer whose request was
// written and whose answer is late.
bool NeverLeft(CURL* easy, CURLcode result) {
  if (result != CURLE_COULDNT_RESOLVE_HOST && result != CURLE_COULDNT_RESOLVE_PROXY &&
      result != CURLE_COULDNT_CONNECT)
    return false;
  long request_bytes = -1;
  return curl_easy_getinfo(easy, CURLINFO_REQUEST_SIZE, &request_bytes) == CURLE_OK &&
         request_bytes == 0;
}

}  // namespace

void InitializeHttp() {
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
    throw std::runtime_error("curl_global_init failed");
  }
}

void ShutdownHttp() {
  curl_global_cleanup();
}

HttpClient::HttpClient(long timeout_ms)
    : multi_(curl_multi_init()), timeout_ms_(timeout_ms), events_(std::make_unique<Events>()) {
  if (multi_ == nullptr) throw std::runtime_error("curl_multi_init failed");
  curl_socket_callback on_socket = [](CURL*, curl_socket_t socket, int what, void* user, void*) {
    auto* events = static_cast<Events*>(user);
    if (what == CURL_POLL_REMOVE) {
      events->sockets.erase(socket);
    } else {
      events->sockets[socket] = what;
    }
    return 0;
  };
  curl_multi_setopt(static_cast<CURLM*>(multi_), CURLMOPT_SOCKETFUNCTION, on_socket);
  curl_multi_setopt(static_cast<CURLM*>(multi_), CURLMOPT_SOCKETDATA, events_.get());
}

HttpClient::~HttpClient() {
  AbortAll();
  curl_multi_cleanup(static_cast<CURLM*>(multi_));
}

void HttpClient::Submit(HttpRequest request) {
  auto transfer = std::make_unique<Transfer>();
  transfer->request = std::move(request);
  transfer->response.tag = transfer->request.tag;
  CURL* easy = curl_easy_init();
  if (easy == nullptr) throw std::runtime_error("curl_easy_init failed");
  transfer->easy = easy;
  for (const auto& header : transfer->request.headers) {
    curl_slist* extended = curl_slist_append(transfer->headers, header.c_str());
    if (extended == nullptr) throw std::runtime_error("curl_slist_append failed");
    transfer->headers = extended;
  }
  curl_easy_setopt(easy, CURLOPT_URL, transfer->request.url.c_str());
  curl_easy_setopt(easy, CURLOPT_HTTPHEADER, transfer->headers);
  if (transfer->request.post) {
    curl_easy_setopt(easy, CURLOPT_POST, 1L);
    curl_easy_setopt(easy, CURLOPT_POSTFIELDS, transfer->request.body.c_str());
    curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE, static_cast<long>(transfer->request.body.size()));
  } else {
    curl_easy_setopt(easy, CURLOPT_HTTPGET, 1L);
  }
  // Signals belong to PostgreSQL; name resolution must not use alarm().
  curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, timeout_ms_);
  curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, std::min(timeout_ms_, 10000L));
  curl_easy_setopt(easy, CURLOPT_TCP_NODELAY, 1L);
  curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(easy, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, OnBody);
  curl_easy_setopt(easy, CURLOPT_WRITEDATA, &transfer->response);
  curl_easy_setopt(easy, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(easy, CURLOPT_HEADERDATA, &transfer->response);
  curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, transfer->error);
  if (curl_multi_add_handle(static_cast<CURLM*>(multi_), easy) != CURLM_OK) {
    throw std::runtime_error("curl_multi_add_handle failed");
  }
  transfers_.emplace(easy, std::move(transfer));
}

void HttpClient::Start() {
  RunDueTimer();
}

// Runs what libcurl's timers say is due: new transfers (added with a timer
// that is due at once), timeouts, retries of a connect.
void HttpClient::RunDueTimer() {
  CURLM* multi = static_cast<CURLM*>(multi_);
  long due_in_ms = -1;
  // Starting transfers may make more due at once; a few rounds at most.
  for (int round = 0; round < 4; ++round) {
    if (curl_multi_timeout(multi, &due_in_ms) != CURLM_OK || due_in_ms != 0) return;
    curl_multi_socket_action(multi, CURL_SOCKET_TIMEOUT, 0, &events_->running);
  }
}

// Waits at most timeout_ms (less when a timer is due sooner) for any
// watched socket, and hands libcurl the sockets that are ready.
void HttpClient::Drive(int timeout_ms) {
  CURLM* multi = static_cast<CURLM*>(multi_);
  RunDueTimer();
  long due_in_ms = -1;
  curl_multi_timeout(multi, &due_in_ms);
  // Nothing to wait for when a transfer already finished (at a loopback
  // server the answer can come within the call that sent the request).
  const bool finished = events_->running < static_cast<int>(transfers_.size());
  int wait_ms = transfers_.empty() || finished ? 0 : timeout_ms;
  if (due_in_ms >= 0 && due_in_ms < wait_ms) wait_ms = static_cast<int>(due_in_ms);

  std::vector<pollfd>& fds = events_->ready;
  fds.clear();
  for (const auto& [socket, what] : events_->sockets) {
    short wanted = 0;
    if (what & CURL_POLL_IN) wanted |= POLLIN;
    if (what & CURL_POLL_OUT) wanted |= POLLOUT;
    fds.push_back(pollfd{socket, wanted, 0});
  }
  // A signal (EINTR) ends the wait early; the caller polls again.
  if (poll(fds.data(), fds.size(), wait_ms) > 0) {
    for (const pollfd& fd : fds) {
      if (fd.revents == 0) continue;
      int action = 0;
      if (fd.revents & (POLLIN | POLLHUP)) action |= CURL_CSELECT_IN;
      if (fd.revents & POLLOUT) action |= CURL_CSELECT_OUT;
      if (fd.revents & (POLLERR | POLLNVAL)) action |= CURL_CSELECT_ERR;
      curl_multi_socket_action(multi, fd.fd, action, &events_->running);
    }
  }
  RunDueTimer();
}

std::vector<HttpResponse> HttpClient::Poll(int timeout_ms) {
  CURLM* multi = static_cast<CURLM*>(multi_);
  Drive(timeout_ms);
  std::vector<HttpResponse> finished;
  int queued = 0;
  while (CURLMsg* message = curl_multi_info_read(multi, &queued)) {
    if (message->msg != CURLMSG_DONE) continue;
    auto found = transfers_.find(message->easy_handle);
    if (found == transfers_.end()) continue;
    std::unique_ptr<Transfer> transfer = std::move(found->second);
    transfers_.erase(found);
    curl_multi_remove_handle(multi, transfer->easy);
    HttpResponse& response = transfer->response;
    if (message->data.result == CURLE_OK) {
      curl_easy_getinfo(transfer->easy, CURLINFO_RESPONSE_CODE, &response.status);
    } else {
      response.status = 0;
      response.transport_error =
          transfer->error[0] != '\0' ? transfer->error : curl_easy_strerror(message->data.result);
      response.request_sent = !NeverLeft(transfer->easy, message->data.result);
    }
    finished.push_back(std::move(response));
  }
  return finished;
}

void HttpClient::AbortAll() {
  for (auto& [easy, transfer] : transfers_) {
    curl_multi_remove_handle(static_cast<CURLM*>(multi_), easy);
  }
  transfers_.clear();
}

}  // namespace billguard
