// The HTTP layer's rules for request lines and headers (see header_rules.hpp).
#include "header_rules.hpp"

#include <algorithm>
#include <cctype>

namespace billguard::proxy {

namespace {

// Headers a handler reads, or that decide the framing: a second value
// would be read by one side and not the other.
constexpr const char* kSingleHeaders[] = {"Idempotency-Key",
                                          "Stripe-Version",
                                          "Content-Length",
                                          "Transfer-Encoding",
                                          "Authorization",
                                          "Content-Type",
                                          "Content-Encoding",
                                          "Stripe-Signature",
                                          "Stripe-Account",
                                          "Stripe-Context",
                                          "Host",
                                          "Expect"};

bool IsSingle(std::string_view name) {
  return std::any_of(std::begin(kSingleHeaders), std::end(kSingleHeaders),
                     [&](const char* single) { return SameHeaderName(std::string(name), single); });
}

bool SameText(std::string_view a, const char* b) {
  return SameHeaderName(std::string(a), b);
}

HttpRefusal BadHeader(const std::string& code, const std::string& message) {
  return HttpRefusal{400, code, message};
}

// A header's name for a message: a name is a token, printable by definition.
std::string Named(std::string_view name) {
  return std::string(name.substr(0, 64));
}

}  // namespace

std::optional<HttpRefusal> CheckRequestLine(std::string_view method, std::string_view target) {
  (void)method;  // a token: the parser refuses anything else
  const bool printable = std::all_of(target.begin(), target.end(), [](char c) {
    return static_cast<unsigned char>(c) > 0x20 && static_cast<unsigned char>(c) < 0x7f;
  });
  if (target.empty() || target[0] != '/' || !printable ||
      target.find('#') != std::string_view::npos) {
    return HttpRefusal{400, "request_malformed",
                       "the request target must be a path and query in printable ASCII "
                       "(origin form), without a fragment"};
  }
  return std::nullopt;
}

std::optional<HttpRefusal> CheckHeaderLine(
    std::string_view name, std::string_view value,
    const std::vector<std::pair<std::string, std::string>>& earlier) {
  const bool single = IsSingle(name);
  for (char c : value) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) {
      return BadHeader("header_invalid", "the " + Named(name) +
                                             " header holds a control character; "
                                             "header values are never decoded or folded");
    }
    if (single && byte > 0x7f) {
      return BadHeader("header_invalid", "the " + Named(name) + " header must be printable ASCII");
    }
  }
  if (single) {
    const std::string wanted(name);
    for (const auto& [seen, unused] : earlier) {
      if (SameHeaderName(seen, wanted)) {
        return BadHeader("header_duplicated",
                         "the " + Named(name) + " header may be sent only once");
      }
    }
  }
  return std::nullopt;
}

std::optional<HttpRefusal> CheckHeaderSection(const Request& request, int http_version) {
  if (request.has_header("Transfer-Encoding")) {
    // Beast honours any list that ends in chunked; a front proxy may read
    // "gzip, chunked" or a misspelt coding otherwise, and frame the body
    // differently: only the one coding every party reads alike is taken.
    if (http_version < 11 || !SameText(request.get_header_value("Transfer-Encoding"), "chunked")) {
      return BadHeader("transfer_encoding_unsupported",
                       "Transfer-Encoding must be chunked, and only in HTTP/1.1");
    }
  }
  if (request.has_header("Content-Length")) {
    const std::string length = request.get_header_value("Content-Length");
    const bool digits =
        !length.empty() && length.size() <= 18 &&
        std::all_of(length.begin(), length.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!digits) return BadHeader("request_malformed", "Content-Length must be one number");
  }
  if (request.has_header("Content-Encoding") &&
      !SameText(request.get_header_value("Content-Encoding"), "identity")) {
    // A compressed body is read at its decoded size: never inflated here.
    return HttpRefusal{415, "content_encoding_unsupported",
                       "the spend-cap proxy takes bodies without Content-Encoding"};
  }
  if (request.has_header("Expect") &&
      !SameText(request.get_header_value("Expect"), "100-continue")) {
    return HttpRefusal{417, "expectation_failed", "the only Expect taken is 100-continue"};
  }
  return std::nullopt;
}

std::optional<HttpRefusal> CheckLineFolds(const char* bytes, std::size_t size) {
  for (std::size_t i = 0; i + 1 < size; ++i) {
    if (bytes[i] == '\n' && (bytes[i + 1] == ' ' || bytes[i + 1] == '\t')) {
      return BadHeader("header_invalid", "a header line is folded onto the next (obs-fold)");
    }
  }
  return std::nullopt;
}

HttpRefusal TrailerRefusal() {
  return BadHeader("request_malformed", "a chunked body may not carry trailer fields");
}

HttpRefusal ChunkExtensionRefusal() {
  return BadHeader("request_malformed", "a chunked body may not carry chunk extensions");
}

}  // namespace billguard::proxy
