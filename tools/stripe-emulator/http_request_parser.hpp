// Parsing of an HTTP/1.1 request head (request line and header fields).
// The server reads the body afterwards, using what this reports.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "http_exchange.hpp"

namespace stripe_emulator {

enum class HeadProblem {
  none,
  malformed,            // 400
  unsupported_version,  // 505
  chunked_body,         // 411: only Content-Length bodies are supported
};

struct RequestHead {
  HttpRequest request;  // everything but the body
  std::size_t content_length = 0;
  bool keep_alive = true;
  bool expects_continue = false;  // "Expect: 100-continue": answer before reading the body
};

struct HeadParseResult {
  HeadProblem problem = HeadProblem::none;
  std::string detail;  // why, for the 400 message
  RequestHead head;
};

// `head` is everything before the blank line that ends the header section.
HeadParseResult parse_request_head(std::string_view head);

}  // namespace stripe_emulator
