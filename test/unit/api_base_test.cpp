// Unit tests of billguard.api_base validation (common/api_base.cpp), printing
// TAP: every spelling that could make libcurl send the key in clear text to a
// host that is not loopback is refused, with a reason.
#include <string>
#include <vector>

#include "api_base.hpp"

#include "tap.hpp"

namespace {

void Accepted(const std::string& url, const std::string& why) {
  const std::string error = billguard::ApiBaseError(url);
  tap::Ok(error.empty(), "accepted: " + url + " (" + why + ")");
  if (!error.empty()) std::printf("#   refused: %s\n", error.c_str());
}

// Refused, with a reason that contains one of reason_parts: where libcurl
// versions parse a URL differently, each refuses it for its own reason.
void RefusedForEither(const std::string& url, const std::vector<std::string>& reason_parts,
                      const std::string& why) {
  const std::string error = billguard::ApiBaseError(url);
  bool found = false;
  for (const auto& part : reason_parts) found = found || error.find(part) != std::string::npos;
  tap::Ok(!error.empty() && found, "refused: " + url + " (" + why + ")");
  if (!found) {
    std::printf("#   reason: '%s', expected it to contain '%s'\n", error.c_str(),
                reason_parts.front().c_str());
  }
}

void Refused(const std::string& url, const std::string& reason_part, const std::string& why) {
  RefusedForEither(url, {reason_part}, why);
}

}  // namespace

int main() {
  Accepted("https://api.stripe.com", "https anywhere");
  Accepted("https://proxy.internal:8443/stripe", "https with a port and a path");
  Accepted("http://127.0.0.1:12111", "the emulator");
  Accepted("http://127.255.0.9", "all of 127.0.0.0/8");
  Accepted("http://localhost:8080", "localhost");
  Accepted("http://[::1]:8080", "IPv6 loopback");
  Accepted("http://127.0.0.1:12111/proxy", "a path");

  // The reported bypass: libcurl connects to the host after the '@'.
  Refused("http://127.0.0.1:80@evil.example", "user name, password", "userinfo with a password");
  Refused("http://127.0.0.1@evil.example", "user name, password", "userinfo");
  Refused("http://@127.0.0.1", "user name, password", "empty userinfo");
  Refused("http://:@127.0.0.1", "user name, password", "empty user and password");
  Refused("http://127.0.0.1;x@evil.example", "user name, password", "login options");
  Refused("http://127.0.0.1\\@evil.example", "user name, password", "a backslash before '@'");
  Refused("https://user:pw@api.stripe.com", "user name, password", "userinfo even with https");

  Refused("http://example.com", "loopback", "http to another host");
  Refused("http://127.evil.com", "loopback", "a name that starts with 127.");
  Refused("http://127.0.0.1.nip.io", "loopback", "a longer name");
  Refused("http://localhost.", "loopback", "a trailing dot");
  // Newer libcurl (forky's) drops the dot after an IPv4 address, so that
  // the URL is not as libcurl writes it.
  RefusedForEither("http://127.0.0.1.", {"loopback", "as libcurl writes it: http://127.0.0.1."},
                   "an IPv4 address with a trailing dot");
  Refused("http://LOCALHOST", "loopback", "localhost in capitals (not certain)");
  Refused("http://[::ffff:127.0.0.1]", "loopback", "an IPv4-mapped IPv6 address");
  Refused("http://10.0.0.1", "loopback", "a private address is still a network");
  Refused("ftp://127.0.0.1", "", "another scheme");
  Refused("ftp://127.0.0.1", "loopback", "another scheme, with a reason");

  // Other spellings of 127.0.0.1 that libcurl accepts and rewrites.
  Refused("http://2130706433", "as libcurl writes it: http://127.0.0.1", "a 32-bit number");
  Refused("http://0x7f.1", "as libcurl writes it", "hexadecimal and a short form");
  Refused("http://127.1", "as libcurl writes it", "a short form");
  Refused("http://0177.0.0.1", "as libcurl writes it", "octal");
  Refused("http://127.0.0.01", "as libcurl writes it", "a leading zero");
  Refused("http://%31%32%37.0.0.1", "as libcurl writes it", "percent-encoding in the host");
  Refused("http://[0:0:0:0:0:0:0:1]", "as libcurl writes it", "IPv6 loopback, not compressed");
  Refused("http:///127.0.0.1", "as libcurl writes it", "three slashes");
  Refused("HTTP://127.0.0.1", "as libcurl writes it", "a scheme in capitals");
  Refused("http://127.0.0.1:", "as libcurl writes it", "an empty port");
  Refused("http://127.0.0.1:080", "as libcurl writes it", "a port with a leading zero");
  Refused("http://127.0.0.1/a/../b", "as libcurl writes it", "dot segments in the path");

  Refused("http://[::1%25lo]", "zone id", "an IPv6 zone id");
  // The same reason whether libcurl keeps an empty query or fragment or
  // drops it when it parses (bookworm's drops '#', trixie's both).
  Refused("http://127.0.0.1#", "query or a fragment", "an empty fragment");
  Refused("http://127.0.0.1?", "query or a fragment", "an empty query");
  Refused("http://127.0.0.1?x=1", "query or a fragment", "a query");
  Refused("https://api.stripe.com#x", "query or a fragment", "a fragment");
  Refused("https://api.stripe.com/", "'/'", "a trailing slash");
  Refused("", "empty", "an empty value");
  Refused("http://127.0.0.1 ", "parse", "a trailing space");
  Refused("http:127.0.0.1", "parse", "no authority");
  Refused("http://127.0.0.1:99999", "parse", "a port out of range");
  Refused("https://:443", "parse", "no host");
  return tap::Done();
}
