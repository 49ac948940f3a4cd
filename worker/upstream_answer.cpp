// Stripe's answer as the proxy relays and settles it (see upstream_answer.hpp).
#include "upstream_answer.hpp"

#include "stripe_response.hpp"

namespace billguard::proxy {

namespace {

// The length of the valid UTF-8 sequence at `at` (never a NUL, an overlong
// form, a surrogate or past U+10FFFF), or 0.
std::size_t Utf8SequenceAt(const std::string& s, std::size_t at) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char lead = byte(at);
  if (lead >= 0x01 && lead <= 0x7f) return 1;
  std::size_t length = 0;
  unsigned char low = 0x80, high = 0xbf;  // the range of the second byte
  if (lead >= 0xc2 && lead <= 0xdf) {
    length = 2;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3;
    if (lead == 0xe0) low = 0xa0;
    if (lead == 0xed) high = 0x9f;
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4;
    if (lead == 0xf0) low = 0x90;
    if (lead == 0xf4) high = 0x8f;
  } else {
    return 0;
  }
  if (at + length > s.size()) return 0;
  if (byte(at + 1) < low || byte(at + 1) > high) return 0;
  for (std::size_t i = 2; i < length; ++i) {
    if (byte(at + i) < 0x80 || byte(at + i) > 0xbf) return 0;
  }
  return length;
}

}  // namespace

std::string StorableText(const std::string& bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (std::size_t i = 0; i < bytes.size();) {
    const std::size_t length = Utf8SequenceAt(bytes, i);
    if (length == 0) {
      out += "\xef\xbf\xbd";
      ++i;
    } else {
      out.append(bytes, i, length);
      i += length;
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
