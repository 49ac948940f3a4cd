// Requests and answers of the proxy's handlers (see http_message.hpp).
#include "http_message.hpp"

namespace billguard::proxy {

namespace {

char Lower(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}

}  // namespace

bool SameHeaderName(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (Lower(a[i]) != Lower(b[i])) return false;
  }
  return true;
}

bool Request::has_header(const std::string& name) const {
  for (const auto& [key, value] : headers) {
    if (SameHeaderName(key, name)) return true;
  }
  return false;
}

std::string Request::get_header_value(const std::string& name) const {
  for (const auto& [key, value] : headers) {
    if (SameHeaderName(key, name)) return value;
  }
  return "";
}

void Response::set_header(const std::string& name, const std::string& value) {
  for (auto& [key, old] : headers) {
    if (SameHeaderName(key, name)) {
      old = value;
      return;
    }
  }
  headers.emplace_back(name, value);
}

void Response::set_content(const std::string& content, const std::string& type) {
  body = content;
  content_type = type;
}

}  // namespace billguard::proxy
