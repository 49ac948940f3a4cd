// Validation of billguard.api_base (see api_base.hpp).
#include "cpp_only.hpp"

#include "api_base.hpp"

namespace billguard {

namespace {

bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// 127.a.b.c with decimal octets: the IPv4 loopback network.
bool IsIpv4Loopback(const std::string& host) {
  if (!StartsWith(host, "127.")) return false;
  int dots = 0;
  int digits = 0;
  for (char c : host.substr(4)) {
    if (c == '.') {
      if (digits == 0) return false;
      ++dots;
      digits = 0;
    } else if (c >= '0' && c <= '9' && digits < 3) {
      ++digits;
    } else {
      return false;
    }
  }
  return dots == 2 && digits > 0;
}

}  // namespace

bool IsAcceptableApiBase(const std::string& url) {
  if (url.empty() || url.back() == '/') return false;
  if (url.find_first_of(" \t\r\n?#") != std::string::npos) return false;
  if (StartsWith(url, "https://")) return url.size() > 8;
  if (!StartsWith(url, "http://")) return false;
  std::string host = url.substr(7);
  host = host.substr(0, host.find('/'));
  if (StartsWith(host, "[::1]")) return host == "[::1]" || StartsWith(host, "[::1]:");
  host = host.substr(0, host.find(':'));
  return host == "localhost" || IsIpv4Loopback(host);
}

}  // namespace billguard
