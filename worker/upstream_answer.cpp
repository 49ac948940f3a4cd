// Stripe's answer as the proxy relays and settles it (see upstream_answer.hpp).
#include "upstream_answer.hpp"

#include <optional>

#include "stripe_response.hpp"
#include "utf8.hpp"

namespace billguard::proxy {

std::string StorableText(const std::string& bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (std::size_t i = 0; i < bytes.size();) {
    const std::size_t start = i;
    const std::optional<char32_t> c = NextCodePoint(bytes, &i);
    if (!c || *c == 0) {  // PostgreSQL's text holds no NUL either
      out += "\xef\xbf\xbd";
      i = start + 1;
    } else {
      out.append(bytes, start, i - start);
    }
  }
  return out;
}

UpstreamAnswer ReadUpstreamAnswer(const HttpResponse& response) {
  const ChargeAnswer read = ReadChargeAnswer(response);
  UpstreamAnswer answer;
  answer.status = static_cast<int>(response.status);
  answer.body = StorableText(response.body);
  if (!read.request_id.empty()) answer.request_id = read.request_id;
  if (response.status == 0) return answer;
  if (!read.error_type.empty()) answer.error_type = read.error_type;
  if (answer.status >= 200 && answer.status < 300 && !read.object_id.empty()) {
    answer.charge_id = read.object_id;
  }
  return answer;
}

}  // namespace billguard::proxy
