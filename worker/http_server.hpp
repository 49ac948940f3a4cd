// The proxy's HTTP/1.1 server, on Boost.Beast's parser and Asio. One I/O
// thread owns every connection: its reads, its parser, its limits
// (header_rules.hpp) and its deadlines. A complete request that passed
// them is handed to the worker pool, which runs the handler (the blocking
// ledger and Stripe calls), sends the answer and arms the next read.
// An idle or trickling connection so costs a socket and a few KiB, never
// a thread, and never delays anyone else's request.
//
// Requests on one connection are answered one at a time, in order
// (pipelining), each read exactly to its end: the bytes after it are the
// next request. A request the HTTP layer refuses is answered with a
// Stripe-shaped 4xx and the connection closed, since its framing can no
// longer be trusted. Beast is compiled in http_server.cpp alone.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "header_rules.hpp"
#include "http_message.hpp"

namespace billguard::proxy {

struct HttpServerOptions {
  std::string host;
  int port = 0;  // 0: any free port (port() tells which)
  std::size_t worker_threads = 64;
  std::size_t max_connections = 10000;
  HttpLimits limits;
  // From a request's first byte to the end of its header section.
  std::chrono::milliseconds header_timeout{10000};
  // From the end of the header section to the end of the body.
  std::chrono::milliseconds body_timeout{10000};
  // A kept-alive connection waiting for its next request.
  std::chrono::milliseconds idle_timeout{60000};
  // Writing an answer to a client that does not read it.
  std::chrono::milliseconds write_timeout{10000};
};

class HttpServer {
 public:
  // Runs on a worker thread for every complete request; an exception it
  // throws is answered 500.
  using RequestHandler = std::function<void(Request&, Response&)>;
  // Runs on the I/O thread for every request the HTTP layer refuses.
  using RefusalObserver = std::function<void(int status)>;

  // Listens at once; throws StartupError (secret_flags.hpp) when it cannot.
  HttpServer(const HttpServerOptions& options, RequestHandler handler, RefusalObserver refused);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;
  // Serves until Stop; then finishes the requests the workers are running.
  void Run();
  // From any thread.
  void Stop();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace billguard::proxy
