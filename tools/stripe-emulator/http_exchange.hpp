// HTTP request and response as the handlers see them, independent of sockets.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace stripe_emulator {

using HeaderList = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;
  std::string target;  // as sent: path plus optional "?query"
  std::string path;
  std::string query;  // without the '?', still percent-encoded
  std::string version;
  HeaderList headers;  // names lower-cased, values trimmed
  std::string body;
  bool peer_is_loopback = false;

  // The last value of a header, or nullptr. `lower_case_name` must be lower case.
  const std::string* header(std::string_view lower_case_name) const {
    const std::string* found = nullptr;
    for (const auto& [name, value] : headers) {
      if (name == lower_case_name) found = &value;
    }
    return found;
  }
};

struct HttpResponse {
  int status = 200;
  HeaderList headers;  // Content-Length, Connection and Request-Id are added by the server
  std::string body;
};

inline HttpResponse json_response(int status, std::string body) {
  HttpResponse response;
  response.status = status;
  response.headers.emplace_back("Content-Type", "application/json");
  response.body = std::move(body);
  return response;
}

// What the connection does once the handler has decided. The two fault
// behaviours need the socket, which only the server has.
enum class AfterHandling {
  send_response,
  drop_connection,           // close without writing a byte
  hang_until_client_closes,  // write nothing, keep the socket open
};

struct HandlerResult {
  HttpResponse response;
  AfterHandling after = AfterHandling::send_response;
};

}  // namespace stripe_emulator
