#include "webhook_client.hpp"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace stripe_emulator {

namespace {

class Socket {
 public:
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_;
};

bool wait_for(int fd, short events, int timeout_ms) {
  pollfd waiting{fd, events, 0};
  int ready;
  do {
    ready = ::poll(&waiting, 1, timeout_ms);
  } while (ready < 0 && errno == EINTR);
  return ready > 0;
}

// A connected non-blocking socket, or -1 with `error` set.
int connect_to(const WebhookEndpoint& endpoint, int timeout_ms, std::string& error) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(endpoint.host.c_str(), endpoint.port.c_str(), &hints, &found)) {
    error = std::string("cannot resolve ") + endpoint.host + ": " + ::gai_strerror(rc);
    return -1;
  }
  int connected = -1;
  for (addrinfo* address = found; address && connected < 0; address = address->ai_next) {
    const int fd = ::socket(address->ai_family, address->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                            address->ai_protocol);
    if (fd < 0) continue;
    int so_error = 0;
    socklen_t length = sizeof so_error;
    if (::connect(fd, address->ai_addr, address->ai_addrlen) == 0 ||
        (errno == EINPROGRESS && wait_for(fd, POLLOUT, timeout_ms) &&
         ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &length) == 0 && so_error == 0)) {
      connected = fd;
    } else {
      error = std::string("cannot connect: ") + std::strerror(so_error ? so_error : errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(found);
  return connected;
}

}  // namespace

bool parse_webhook_url(const std::string& url, WebhookEndpoint& endpoint, std::string& error) {
  static const std::string kScheme = "http://";
  if (url.compare(0, kScheme.size(), kScheme) != 0) {
    error = "the webhook URL must start with http://";
    return false;
  }
  const std::string rest = url.substr(kScheme.size());
  const std::size_t slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  endpoint.path = slash == std::string::npos ? "/" : rest.substr(slash);
  endpoint.port = "80";
  const std::size_t bracket = authority.rfind(']');
  const std::size_t colon = authority.rfind(':');
  if (colon != std::string::npos && (bracket == std::string::npos || colon > bracket)) {
    endpoint.port = authority.substr(colon + 1);
    authority = authority.substr(0, colon);
  }
  if (authority.size() > 2 && authority.front() == '[' && authority.back() == ']')
    authority = authority.substr(1, authority.size() - 2);
  endpoint.host = authority;
  if (endpoint.host.empty() || endpoint.port.empty() ||
      endpoint.port.find_first_not_of("0123456789") != std::string::npos ||
      endpoint.path.find_first_of(" \r\n") != std::string::npos) {
    error = "the webhook URL must be http://HOST[:PORT][/PATH]";
    return false;
  }
  return true;
}

PostResult post_webhook(const WebhookEndpoint& endpoint, const HeaderList& headers,
                        const std::string& body, int timeout_ms) {
  PostResult result;
  const Socket socket(connect_to(endpoint, timeout_ms, result.error));
  if (socket.fd() < 0) return result;
  std::string request = "POST " + endpoint.path + " HTTP/1.1\r\nHost: " + endpoint.host + ":" +
                        endpoint.port + "\r\n";
  for (const auto& [name, value] : headers) request += name + ": " + value + "\r\n";
  request += "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
  request += body;
  for (std::size_t sent = 0; sent < request.size();) {
    if (!wait_for(socket.fd(), POLLOUT, timeout_ms)) {
      result.error = "timed out sending";
      return result;
    }
    const ssize_t n =
        ::send(socket.fd(), request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno != EINTR && errno != EAGAIN) {
      result.error = std::string("cannot send: ") + std::strerror(errno);
      return result;
    }
    if (n > 0) sent += static_cast<std::size_t>(n);
  }
  // Only the status line matters: "HTTP/1.1 200 OK".
  std::string answer;
  while (answer.find("\r\n") == std::string::npos) {
    if (!wait_for(socket.fd(), POLLIN, timeout_ms)) {
      result.error = "timed out waiting for the answer";
      return result;
    }
    char chunk[1024];
    const ssize_t n = ::recv(socket.fd(), chunk, sizeof chunk, 0);
    if (n == 0) break;
    if (n < 0 && errno != EINTR && errno != EAGAIN) {
      result.error = std::string("cannot read the answer: ") + std::strerror(errno);
      return result;
    }
    if (n > 0) answer.append(chunk, static_cast<std::size_t>(n));
    if (answer.size() > 8192) break;
  }
  if (answer.compare(0, 5, "HTTP/") != 0 || answer.find(' ') == std::string::npos) {
    result.error = "no HTTP answer";
    return result;
  }
  const std::string code = answer.substr(answer.find(' ') + 1, 3);
  if (code.size() != 3 || code.find_first_not_of("0123456789") != std::string::npos) {
    result.error = "a malformed status line";
    return result;
  }
  result.status = std::stoi(code);
  return result;
}

}  // namespace stripe_emulator
