// What the proxy's HTTP layer refuses before any handler sees a request,
// beyond what its parser (Boost.Beast) refuses by itself. The proxy stands
// between a client it does not trust and Stripe: a header that one side
// reads one way and the other side another way (a line fold, a control
// character, two values of one header, a framing only one of them honours)
// is how a request gets past the cap or is smuggled behind a front proxy,
// so each is refused whole, with a Stripe-shaped 4xx, and nothing of the
// request reaches a handler.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "http_message.hpp"

namespace billguard::proxy {

// A request the HTTP layer refuses: the status and the Stripe error code
// and message it answers with. The connection is closed after the answer.
struct HttpRefusal {
  int status;
  std::string code;
  std::string message;
};

// The limits every request is read within (worker/README.md: "Limits and deadlines").
struct HttpLimits {
  std::size_t header_bytes = 8 * 1024;  // request line and header lines
  std::size_t header_fields = 64;
  std::size_t body_bytes = 64 * 1024;  // after de-chunking, whatever the framing
};

// The request line's method and target: origin form ("/path?query") in
// printable ASCII, nothing a URL parser downstream could read otherwise.
std::optional<HttpRefusal> CheckRequestLine(std::string_view method, std::string_view target);

// One header line as the parser read it (surrounding white space trimmed),
// against the lines before it: no control character (HTAB included) in
// the value, printable ASCII in the headers the proxy reads, and a header
// that must be single (Idempotency-Key, Stripe-Version, Content-Length,
// Transfer-Encoding, Authorization, ...) at most once.
std::optional<HttpRefusal> CheckHeaderLine(
    std::string_view name, std::string_view value,
    const std::vector<std::pair<std::string, std::string>>& earlier);

// The header section once complete: the framing (Transfer-Encoding exactly
// "chunked", and only in HTTP/1.1; Content-Length digits only), no content
// coding but identity, and no expectation but 100-continue.
std::optional<HttpRefusal> CheckHeaderSection(const Request& request, int http_version);

// Raw header bytes holding an obsolete line fold (a line break followed by
// a space or tab), which the parser would join into the line above and
// another reader would take as a line of its own.
std::optional<HttpRefusal> CheckLineFolds(const char* bytes, std::size_t size);

// A chunked body's trailer fields and chunk extensions: never accepted,
// since a trailer could add a header after the header section was checked.
HttpRefusal TrailerRefusal();
HttpRefusal ChunkExtensionRefusal();

}  // namespace billguard::proxy
