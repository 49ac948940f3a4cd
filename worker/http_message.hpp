// A request as the proxy's handlers see it, and the answer they fill in.
// The HTTP server (http_server.hpp) hands over only complete requests that
// passed its rules (header_rules.hpp): names and values exactly as sent,
// never decoded, each header that must be single present at most once.
// The member names follow the handlers' first server library, so that the
// handlers did not change with the server.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace billguard::proxy {

struct Request {
  std::string method;  // as sent, e.g. GET
  std::string target;  // the request line's target: path and query, undecoded
  std::string path;    // target up to '?'
  std::vector<std::pair<std::string, std::string>> headers;  // names and values as sent
  std::string body;                                          // de-chunked, never decoded
  std::vector<std::string> matches;  // the route's pattern: [0] the path, then its groups

  // Header names compare case-insensitively.
  bool has_header(const std::string& name) const;
  // The header's value, "" when absent.
  std::string get_header_value(const std::string& name) const;
};

struct Response {
  int status = 200;
  std::string body;
  std::string content_type;
  std::vector<std::pair<std::string, std::string>> headers;

  void set_header(const std::string& name, const std::string& value);
  void set_content(const std::string& content, const std::string& type);
};

// ASCII case-insensitive equality, as header names compare.
bool SameHeaderName(const std::string& a, const std::string& b);

}  // namespace billguard::proxy
