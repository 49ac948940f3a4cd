// Concurrent HTTP requests over libcurl's multi interface. Pure C++ (no
// PostgreSQL headers): it never touches the database, and it runs in the
// dispatcher while no transaction is open.
#pragma once

#include "cpp_only.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace billguard {

struct HttpRequest {
  std::uint64_t tag = 0;  // the caller's id, returned with the response
  bool post = true;       // POST with body, or GET
  std::string url;
  std::vector<std::string> headers;  // "Name: value"
  std::string body;
};

struct HttpResponse {
  std::uint64_t tag = 0;
  long status = 0;              // 0 when no HTTP response arrived
  std::string transport_error;  // why no response arrived (status 0)
  bool request_sent = true;     // false only when it provably never left
  std::string body;
  std::string idempotent_replayed;  // header values, empty when absent
  std::string should_retry;
  std::string request_id;
};

// Once per process, before any HttpClient (curl_global_init is not
// thread-safe and must not run in the postmaster).
void InitializeHttp();
void ShutdownHttp();

// Driven through libcurl's socket interface: each call touches only the
// connections that have something to do and the transfers whose timers are
// due, not every transfer in flight, so its cost does not grow with
// max_inflight.
class HttpClient {
 public:
  explicit HttpClient(long timeout_ms);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  void set_timeout_ms(long timeout_ms) { timeout_ms_ = timeout_ms; }
  void Submit(HttpRequest request);
  // Starts the submitted requests now (connect, send) rather than at the
  // next Poll; their answers are returned by Poll.
  void Start();
  // Drives all transfers, waiting at most timeout_ms for activity, and
  // returns the ones that finished.
  std::vector<HttpResponse> Poll(int timeout_ms);
  // Drops every transfer without waiting for answers.
  void AbortAll();

 private:
  struct Transfer;
  struct Events;  // the sockets and the timer libcurl asks us to watch
  void Drive(int timeout_ms);
  void RunDueTimer();
  void* multi_;  // CURLM*
  long timeout_ms_;
  std::unique_ptr<Events> events_;
  std::unordered_map<void*, std::unique_ptr<Transfer>> transfers_;  // by CURL*
};

}  // namespace billguard
