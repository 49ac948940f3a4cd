#include "threaded_http_server.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string_view>
#include <system_error>
#include <thread>

#include "http_request_parser.hpp"
#include "random_ids.hpp"
#include "stripe_error_catalog.hpp"

namespace stripe_emulator {

namespace {

constexpr std::size_t kMaxHeadBytes = 64 * 1024;
constexpr std::size_t kMaxBodyBytes = 1024 * 1024;
// Idle keep-alive connections are closed eventually so threads do not pile up.
constexpr int kIdleTimeoutMs = 5 * 60 * 1000;
constexpr auto kLongestHang = std::chrono::milliseconds(10 * 60 * 1000);
// After an error that ends the connection, how long to drain what the client
// is still sending, so closing does not reset the socket before it reads the answer.
constexpr auto kDrainTime = std::chrono::milliseconds(2000);

const char* reason_phrase(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 402:
      return "Payment Required";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 409:
      return "Conflict";
    case 411:
      return "Length Required";
    case 413:
      return "Content Too Large";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 502:
      return "Bad Gateway";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    case 505:
      return "HTTP Version Not Supported";
  }
  return status < 500 ? "Client Error" : "Server Error";
}

bool is_loopback(const sockaddr_storage& address) {
  if (address.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(address);
    return (ntohl(v4.sin_addr.s_addr) >> 24) == 127;
  }
  if (address.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(address);
    if (IN6_IS_ADDR_LOOPBACK(&v6.sin6_addr)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6.sin6_addr) && v6.sin6_addr.s6_addr[12] == 127;
  }
  return false;
}

bool send_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t sent = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data.remove_prefix(static_cast<std::size_t>(sent));
  }
  return true;
}

// Waits up to `timeout_ms` for input and appends it; false on EOF, error or timeout.
bool receive_more(int fd, std::string& buffer, int timeout_ms) {
  char chunk[16 * 1024];
  while (true) {
    pollfd waiting{fd, POLLIN, 0};
    const int ready = ::poll(&waiting, 1, timeout_ms);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return false;
    const ssize_t received = ::recv(fd, chunk, sizeof chunk, 0);
    if (received < 0 && errno == EINTR) continue;
    if (received <= 0) return false;
    buffer.append(chunk, static_cast<std::size_t>(received));
    // Acknowledge at once. A client without TCP_NODELAY that writes the head
    // and the body separately would otherwise wait for our delayed ACK
    // (~40 ms) before Nagle lets the body out. Linux clears this flag by
    // itself, hence setting it after every read.
    const int on = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_QUICKACK, &on, sizeof on);
    return true;
  }
}

std::string serialize_response(const HttpResponse& response, bool keep_alive) {
  std::string out;
  out.reserve(256 + response.body.size());
  out += "HTTP/1.1 ";
  out += std::to_string(response.status);
  out += ' ';
  out += reason_phrase(response.status);
  out += "\r\n";
  for (const auto& [name, value] : response.headers) {
    out += name;
    out += ": ";
    out += value;
    out += "\r\n";
  }
  out += "Content-Length: " + std::to_string(response.body.size()) + "\r\n";
  out += "Request-Id: " + new_request_id() + "\r\n";
  out += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  out += response.body;
  return out;
}

HttpResponse protocol_error_response(int status, std::string message) {
  const ApiResponse rendered =
      render_error(errors::plain_request_error(status, std::move(message)));
  return json_response(rendered.status, rendered.body);
}

// Reads and throws away input until the client closes, an error, or `longest`.
void discard_input_until_closed(int fd, std::chrono::milliseconds longest) {
  const auto deadline = std::chrono::steady_clock::now() + longest;
  char scratch[16 * 1024];
  while (true) {
    const auto remaining = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (remaining.count() <= 0) return;
    pollfd waiting{fd, POLLIN, 0};
    const int ready =
        ::poll(&waiting, 1, static_cast<int>(std::min<long long>(remaining.count(), 60000)));
    if (ready < 0 && errno != EINTR) return;
    if (ready <= 0) continue;
    const ssize_t received = ::recv(fd, scratch, sizeof scratch, 0);
    if (received == 0 || (received < 0 && errno != EINTR)) return;
  }
}

// Answers an unusable request and ends the connection. The socket is
// half-closed and drained first: closing with unread input would reset the
// connection and could destroy the answer before the client reads it.
void send_error_and_close(int fd, int status, std::string message) {
  send_all(fd, serialize_response(protocol_error_response(status, std::move(message)), false));
  ::shutdown(fd, SHUT_WR);
  discard_input_until_closed(fd, kDrainTime);
  ::close(fd);
}

void log_request(const HttpRequest& request, const HandlerResult& result) {
  const char* replayed = "false";
  for (const auto& [name, value] : result.response.headers) {
    if (name == "Idempotent-Replayed" && value == "true") replayed = "true";
  }
  const char* fate = "";
  if (result.after == AfterHandling::drop_connection) fate = " (connection dropped, no response)";
  if (result.after == AfterHandling::hang_until_client_closes) fate = " (hanging, no response)";
  // One fprintf per line: stdio locks the stream, so lines from threads do not interleave.
  // Only method, path and outcome are logged: never headers (Authorization) or bodies.
  std::fprintf(stderr, "%s %s %d replayed=%s%s\n", request.method.c_str(), request.path.c_str(),
               result.response.status, replayed, fate);
}

}  // namespace

HttpServer::HttpServer(Handler handler, bool log_requests)
    : handler_(std::move(handler)), log_requests_(log_requests) {}

HttpServer::~HttpServer() {
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

std::uint16_t HttpServer::listen_on(const std::string& host, std::uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* candidates = nullptr;
  const std::string port_text = std::to_string(port);
  const int lookup = ::getaddrinfo(host.c_str(), port_text.c_str(), &hints, &candidates);
  if (lookup != 0) {
    throw std::runtime_error("cannot resolve " + host + ": " + ::gai_strerror(lookup));
  }
  std::string last_error = "no usable address";
  for (addrinfo* candidate = candidates; candidate; candidate = candidate->ai_next) {
    const int fd = ::socket(candidate->ai_family, candidate->ai_socktype | SOCK_CLOEXEC,
                            candidate->ai_protocol);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    const int on = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    // "::" means IPv6 only: listen exactly where told.
    if (candidate->ai_family == AF_INET6)
      ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof on);
    if (::bind(fd, candidate->ai_addr, candidate->ai_addrlen) != 0 || ::listen(fd, 1024) != 0) {
      last_error = std::strerror(errno);
      ::close(fd);
      continue;
    }
    ::freeaddrinfo(candidates);
    listen_fd_ = fd;
    sockaddr_storage bound{};
    socklen_t bound_length = sizeof bound;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &bound_length);
    if (bound.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6&>(bound).sin6_port);
    return ntohs(reinterpret_cast<sockaddr_in&>(bound).sin_port);
  }
  ::freeaddrinfo(candidates);
  throw std::runtime_error("cannot listen on " + host + ":" + port_text + ": " + last_error);
}

void HttpServer::serve_forever() {
  while (true) {
    sockaddr_storage peer{};
    socklen_t peer_length = sizeof peer;
    const int fd =
        ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &peer_length, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));  // wait for connections to end
      }
      continue;  // EINTR, ECONNABORTED and the like: just accept the next one
    }
    // Responses go out in one send; without this, Nagle's algorithm could hold
    // back a small response behind the client's delayed ACK.
    const int on = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
    const bool loopback = is_loopback(peer);
    try {
      std::thread([this, fd, loopback] { serve_connection(fd, loopback); }).detach();
    } catch (const std::system_error&) {
      ::close(fd);  // out of threads: refuse this connection, keep serving others
    }
  }
}

void HttpServer::serve_connection(int fd, bool peer_is_loopback) const {
  std::string buffer;
  while (true) {
    // Read the head. Blank lines before a request line are tolerated (RFC 9112).
    std::size_t head_end;
    std::size_t searched_up_to = 0;
    while (true) {
      while (buffer.compare(0, 2, "\r\n") == 0) buffer.erase(0, 2);
      head_end = buffer.find("\r\n\r\n", searched_up_to);
      if (head_end != std::string::npos) break;
      if (buffer.size() > kMaxHeadBytes) {
        send_error_and_close(fd, 431, "Request header section is larger than 64 KiB.");
        return;
      }
      searched_up_to = buffer.size() < 3 ? 0 : buffer.size() - 3;
      if (!receive_more(fd, buffer, kIdleTimeoutMs)) {
        ::close(fd);
        return;
      }
    }

    HeadParseResult parsed = parse_request_head(std::string_view(buffer).substr(0, head_end));
    switch (parsed.problem) {
      case HeadProblem::none:
        break;
      case HeadProblem::malformed:
        send_error_and_close(fd, 400, "Malformed HTTP request: " + parsed.detail + ".");
        return;
      case HeadProblem::unsupported_version:
        send_error_and_close(fd, 505, parsed.detail + ".");
        return;
      case HeadProblem::chunked_body:
        send_error_and_close(fd, 411, parsed.detail + ".");
        return;
    }
    RequestHead& head = parsed.head;
    if (head.content_length > kMaxBodyBytes) {
      send_error_and_close(fd, 413, "Request body is larger than 1 MiB.");
      return;
    }

    const std::size_t body_start = head_end + 4;
    const std::size_t request_end = body_start + head.content_length;
    if (head.expects_continue && buffer.size() < request_end &&
        !send_all(fd, "HTTP/1.1 100 Continue\r\n\r\n")) {
      ::close(fd);
      return;
    }
    while (buffer.size() < request_end) {
      if (!receive_more(fd, buffer, kIdleTimeoutMs)) {
        ::close(fd);
        return;
      }
    }

    HttpRequest& request = head.request;
    request.body = buffer.substr(body_start, head.content_length);
    request.peer_is_loopback = peer_is_loopback;
    buffer.erase(0, request_end);  // anything left is the next (pipelined) request

    HandlerResult result;
    try {
      result = handler_(request);
    } catch (const std::exception& failure) {
      std::fprintf(stderr, "handler failed: %s\n", failure.what());
      const ApiResponse rendered = render_error(errors::api_error(500));
      result.response = json_response(rendered.status, rendered.body);
    }
    if (log_requests_) log_request(request, result);

    switch (result.after) {
      case AfterHandling::drop_connection:
        ::shutdown(fd, SHUT_RDWR);
        ::close(fd);
        return;
      case AfterHandling::hang_until_client_closes:
        // The request was read; no answer ever comes. Input is still drained
        // so the client's close is noticed and this thread ends with it.
        discard_input_until_closed(fd, kLongestHang);
        ::close(fd);
        return;
      case AfterHandling::send_response:
        break;
    }
    if (!send_all(fd, serialize_response(result.response, head.keep_alive)) || !head.keep_alive) {
      ::close(fd);
      return;
    }
  }
}

}  // namespace stripe_emulator
