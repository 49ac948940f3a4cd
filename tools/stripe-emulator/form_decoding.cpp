#include "form_decoding.hpp"

namespace stripe_emulator {

namespace {

int hex_digit_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::optional<std::string> percent_decode(std::string_view encoded) {
  std::string decoded;
  decoded.reserve(encoded.size());
  for (std::size_t pos = 0; pos < encoded.size(); ++pos) {
    const char c = encoded[pos];
    if (c == '+') {
      decoded += ' ';
    } else if (c == '%') {
      if (pos + 2 >= encoded.size()) return std::nullopt;  // needs two hex digits
      const int high = hex_digit_value(encoded[pos + 1]);
      const int low = hex_digit_value(encoded[pos + 2]);
      if (high < 0 || low < 0) return std::nullopt;
      decoded += static_cast<char>(high * 16 + low);
      pos += 2;
    } else {
      decoded += c;
    }
  }
  return decoded;
}

std::optional<FormParams> decode_form(std::string_view encoded) {
  FormParams params;
  std::size_t start = 0;
  while (start <= encoded.size()) {
    std::size_t end = encoded.find('&', start);
    if (end == std::string_view::npos) end = encoded.size();
    const std::string_view pair = encoded.substr(start, end - start);
    start = end + 1;
    if (pair.empty()) continue;
    const std::size_t equals = pair.find('=');
    auto name = percent_decode(pair.substr(0, equals));
    auto value = equals == std::string_view::npos ? std::optional<std::string>("")
                                                  : percent_decode(pair.substr(equals + 1));
    if (!name || !value) return std::nullopt;
    params.emplace_back(std::move(*name), std::move(*value));
  }
  return params;
}

}  // namespace stripe_emulator
