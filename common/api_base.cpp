// Validation of billguard.api_base (see api_base.hpp).
#include "cpp_only.hpp"

#include "api_base.hpp"

#include <curl/curl.h>

#include <memory>

namespace billguard {

namespace {

using UrlHandle = std::unique_ptr<CURLU, decltype(&curl_url_cleanup)>;

// The part as libcurl stores it (not URL-decoded); false when it is absent.
bool GetPart(CURLU* url, CURLUPart part, std::string& value) {
  char* text = nullptr;
  if (curl_url_get(url, part, &text, 0) != CURLUE_OK) return false;
  value = text;
  curl_free(text);
  return true;
}

bool HasPart(CURLU* url, CURLUPart part) {
  std::string ignored;
  return GetPart(url, part, ignored);
}

bool IsDecimalOctet(const std::string& s) {
  if (s.empty() || s.size() > 3 || (s.size() > 1 && s[0] == '0')) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return std::stoi(s) <= 255;
}

// 127.a.b.c in canonical dotted decimal: the IPv4 loopback network.
bool IsLoopbackIpv4(const std::string& host) {
  if (host.compare(0, 4, "127.") != 0) return false;
  std::string rest = host.substr(4);
  for (int octet = 0; octet < 3; ++octet) {
    const auto dot = rest.find('.');
    if ((dot == std::string::npos) != (octet == 2)) return false;
    if (!IsDecimalOctet(rest.substr(0, dot))) return false;
    rest = dot == std::string::npos ? "" : rest.substr(dot + 1);
  }
  return true;
}

bool IsLoopbackHost(const std::string& host) {
  return host == "localhost" || host == "[::1]" || IsLoopbackIpv4(host);
}

}  // namespace

std::string ApiBaseError(const std::string& url) {
  if (url.empty()) return "The URL must not be empty.";
  if (url.back() == '/') return "The URL must not end with '/'.";
  UrlHandle parsed(curl_url(), curl_url_cleanup);
  if (!parsed) return "The URL could not be checked (out of memory).";
  if (curl_url_set(parsed.get(), CURLUPART_URL, url.c_str(), 0) != CURLUE_OK)
    return "It is not a URL libcurl can parse.";
  CURLU* u = parsed.get();
  // libcurl connects to the host after an '@': userinfo could dress any host
  // up as loopback.
  if (HasPart(u, CURLUPART_USER) || HasPart(u, CURLUPART_PASSWORD) || HasPart(u, CURLUPART_OPTIONS))
    return "The URL must not contain a user name, password or login options "
           "(anything before an '@').";
  // Read from the text as well: newer libcurl (trixie's 8.14) drops an empty
  // query ('?' alone) when it parses, and the reason would then depend on
  // the machine's libcurl. In a URL, '?' and '#' only begin these parts.
  if (url.find_first_of("?#") != std::string::npos || HasPart(u, CURLUPART_QUERY) ||
      HasPart(u, CURLUPART_FRAGMENT))
    return "The URL must not contain a query or a fragment.";
  if (HasPart(u, CURLUPART_ZONEID)) return "The URL must not contain an IPv6 zone id.";
  std::string scheme, host, canonical;
  if (!GetPart(u, CURLUPART_SCHEME, scheme) || !GetPart(u, CURLUPART_HOST, host) ||
      !GetPart(u, CURLUPART_URL, canonical))
    return "The URL must name a scheme and a host.";
  // libcurl normalises what it parses (2130706433 and 0x7f.1 become
  // 127.0.0.1, %31 becomes 1, a default path '/' is added): only a URL that
  // reads the same once parsed shows the host that will be used.
  if (canonical != url && canonical != url + "/")
    return "The URL must be written as libcurl writes it: " +
           (canonical.back() == '/' ? canonical.substr(0, canonical.size() - 1) : canonical) + ".";
  if (scheme == "https") return "";
  if (scheme == "http" && IsLoopbackHost(host)) return "";
  return "The URL must be an https:// URL, or http:// to a loopback host "
         "(127.x.y.z, [::1] or localhost): the API key would cross a network in clear text.";
}

}  // namespace billguard
