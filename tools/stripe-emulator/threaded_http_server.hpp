// A small HTTP/1.1 server over POSIX sockets: one thread per connection
// (handlers may sleep to simulate latency without stalling other clients),
// keep-alive, Content-Length bodies up to 1 MiB.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "http_exchange.hpp"

namespace stripe_emulator {

class HttpServer {
 public:
  using Handler = std::function<HandlerResult(const HttpRequest&)>;

  HttpServer(Handler handler, bool log_requests);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and listens on exactly `host` (a numeric address or a name that
  // resolves locally); returns the bound port, the real one when `port` is 0.
  // Throws std::runtime_error with the reason on failure.
  std::uint16_t listen_on(const std::string& host, std::uint16_t port);

  // Accepts connections until the process exits; each runs on its own thread.
  void serve_forever();

 private:
  void serve_connection(int socket_fd, bool peer_is_loopback) const;

  Handler handler_;
  bool log_requests_;
  int listen_fd_ = -1;
};

}  // namespace stripe_emulator
