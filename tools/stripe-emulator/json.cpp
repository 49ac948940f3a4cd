#include "json.hpp"

#include <cerrno>
#include <cstdlib>

namespace stripe_emulator {

namespace {

// Length of the well-formed UTF-8 sequence starting at text[pos], or 0 if the
// bytes there are not one (overlong forms, surrogates and > U+10FFFF included).
std::size_t utf8_sequence_length(std::string_view text, std::size_t pos) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(pos);
  std::size_t length;
  unsigned char second_min = 0x80, second_max = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) second_min = 0xA0;  // overlong
    if (lead == 0xED) second_max = 0x9F;  // UTF-16 surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) second_min = 0x90;  // overlong
    if (lead == 0xF4) second_max = 0x8F;  // beyond U+10FFFF
  } else {
    return 0;
  }
  if (pos + length > text.size()) return 0;
  if (byte(pos + 1) < second_min || byte(pos + 1) > second_max) return 0;
  for (std::size_t i = pos + 2; i < pos + length; ++i) {
    if (byte(i) < 0x80 || byte(i) > 0xBF) return 0;
  }
  return length;
}

void append_utf8(std::string& out, std::uint32_t code_point) {
  if (code_point < 0x80) {
    out += static_cast<char>(code_point);
  } else if (code_point < 0x800) {
    out += static_cast<char>(0xC0 | (code_point >> 6));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else if (code_point < 0x10000) {
    out += static_cast<char>(0xE0 | (code_point >> 12));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (code_point >> 18));
    out += static_cast<char>(0x80 | ((code_point >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  }
}

}  // namespace

void append_json_string(std::string& out, std::string_view text) {
  static const char kHex[] = "0123456789abcdef";
  out += '"';
  for (std::size_t pos = 0; pos < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[pos]);
    if (c >= 0x80) {
      const std::size_t length = utf8_sequence_length(text, pos);
      if (length == 0) {
        out += "\\ufffd";
        ++pos;
      } else {
        out.append(text.substr(pos, length));
        pos += length;
      }
      continue;
    }
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20 || c == 0x7F) {
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 0xF];
        } else {
          out += static_cast<char>(c);
        }
    }
    ++pos;
  }
  out += '"';
}

void JsonWriter::separate_from_previous_value() {
  if (value_completes_member_) {
    value_completes_member_ = false;  // the key already placed the comma
    return;
  }
  if (!container_has_items_.empty()) {
    if (container_has_items_.back()) out_ += ',';
    container_has_items_.back() = true;
  }
}

JsonWriter& JsonWriter::begin_object() {
  separate_from_previous_value();
  out_ += '{';
  container_has_items_.push_back(false);
  return *this;
}

JsonWriter& JsonWriter::end_object() {
  container_has_items_.pop_back();
  out_ += '}';
  return *this;
}

JsonWriter& JsonWriter::begin_array() {
  separate_from_previous_value();
  out_ += '[';
  container_has_items_.push_back(false);
  return *this;
}

JsonWriter& JsonWriter::end_array() {
  container_has_items_.pop_back();
  out_ += ']';
  return *this;
}

JsonWriter& JsonWriter::key(std::string_view name) {
  separate_from_previous_value();
  append_json_string(out_, name);
  out_ += ':';
  value_completes_member_ = true;
  return *this;
}

JsonWriter& JsonWriter::string(std::string_view text) {
  separate_from_previous_value();
  append_json_string(out_, text);
  return *this;
}

JsonWriter& JsonWriter::optional_string(const std::optional<std::string>& text) {
  return text ? string(*text) : null();
}

JsonWriter& JsonWriter::integer(std::int64_t number) {
  separate_from_previous_value();
  out_ += std::to_string(number);
  return *this;
}

JsonWriter& JsonWriter::optional_integer(const std::optional<std::int64_t>& number) {
  return number ? integer(*number) : null();
}

JsonWriter& JsonWriter::boolean(bool flag) {
  separate_from_previous_value();
  out_ += flag ? "true" : "false";
  return *this;
}

JsonWriter& JsonWriter::null() {
  separate_from_previous_value();
  out_ += "null";
  return *this;
}

JsonWriter& JsonWriter::raw(std::string_view rendered_json) {
  separate_from_previous_value();
  out_.append(rendered_json);
  return *this;
}

const JsonValue* JsonValue::member(std::string_view name) const {
  const JsonValue* found = nullptr;
  for (const auto& [member_name, value] : object_members) {
    if (member_name == name) found = &value;
  }
  return found;
}

namespace {

// Recursive descent over RFC 8259. Depth is bounded so a hostile body cannot
// exhaust the connection thread's stack.
class JsonParser {
 public:
  explicit JsonParser(std::string_view text) : text_(text) {}

  std::optional<JsonValue> parse_document(std::string& error) {
    JsonValue value;
    skip_whitespace();
    if (!parse_value(value, 0)) {
      error = error_;
      return std::nullopt;
    }
    skip_whitespace();
    if (pos_ != text_.size()) {
      error = "unexpected trailing characters at offset " + std::to_string(pos_);
      return std::nullopt;
    }
    return value;
  }

 private:
  static constexpr int kMaxDepth = 64;

  bool fail(const std::string& message) {
    error_ = message + " at offset " + std::to_string(pos_);
    return false;
  }

  void skip_whitespace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool consume_literal(std::string_view literal) {
    if (text_.substr(pos_, literal.size()) != literal) return fail("invalid literal");
    pos_ += literal.size();
    return true;
  }

  bool parse_value(JsonValue& value, int depth) {
    if (depth > kMaxDepth) return fail("nesting too deep");
    if (pos_ >= text_.size()) return fail("unexpected end of input");
    switch (text_[pos_]) {
      case '{':
        return parse_object(value, depth);
      case '[':
        return parse_array(value, depth);
      case '"':
        value.type = JsonValue::Type::string;
        return parse_string(value.string_value);
      case 't':
        value.type = JsonValue::Type::boolean;
        value.boolean_value = true;
        return consume_literal("true");
      case 'f':
        value.type = JsonValue::Type::boolean;
        return consume_literal("false");
      case 'n':
        value.type = JsonValue::Type::null;
        return consume_literal("null");
      default:
        return parse_number(value);
    }
  }

  bool parse_object(JsonValue& value, int depth) {
    value.type = JsonValue::Type::object;
    ++pos_;  // '{'
    skip_whitespace();
    if (pos_ < text_.size() && text_[pos_] == '}') {
      ++pos_;
      return true;
    }
    while (true) {
      skip_whitespace();
      if (pos_ >= text_.size() || text_[pos_] != '"') return fail("expected member name");
      std::string name;
      if (!parse_string(name)) return false;
      skip_whitespace();
      if (pos_ >= text_.size() || text_[pos_] != ':') return fail("expected ':'");
      ++pos_;
      skip_whitespace();
      JsonValue member;
      if (!parse_value(member, depth + 1)) return false;
      value.object_members.emplace_back(std::move(name), std::move(member));
      skip_whitespace();
      if (pos_ < text_.size() && text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < text_.size() && text_[pos_] == '}') {
        ++pos_;
        return true;
      }
      return fail("expected ',' or '}'");
    }
  }

  bool parse_array(JsonValue& value, int depth) {
    value.type = JsonValue::Type::array;
    ++pos_;  // '['
    skip_whitespace();
    if (pos_ < text_.size() && text_[pos_] == ']') {
      ++pos_;
      return true;
    }
    while (true) {
      skip_whitespace();
      JsonValue item;
      if (!parse_value(item, depth + 1)) return false;
      value.array_items.push_back(std::move(item));
      skip_whitespace();
      if (pos_ < text_.size() && text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < text_.size() && text_[pos_] == ']') {
        ++pos_;
        return true;
      }
      return fail("expected ',' or ']'");
    }
  }

  bool parse_hex4(std::uint32_t& code_unit) {
    if (pos_ + 4 > text_.size()) return fail("truncated \\u escape");
    code_unit = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[pos_++];
      code_unit <<= 4;
      if (c >= '0' && c <= '9')
        code_unit |= c - '0';
      else if (c >= 'a' && c <= 'f')
        code_unit |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F')
        code_unit |= c - 'A' + 10;
      else
        return fail("invalid \\u escape");
    }
    return true;
  }

  bool parse_unicode_escape(std::string& out) {
    std::uint32_t code_point = 0;
    if (!parse_hex4(code_point)) return false;
    if (code_point >= 0xD800 && code_point <= 0xDBFF) {
      std::uint32_t low = 0;
      if (text_.substr(pos_, 2) != "\\u") return fail("unpaired surrogate");
      pos_ += 2;
      if (!parse_hex4(low)) return false;
      if (low < 0xDC00 || low > 0xDFFF) return fail("unpaired surrogate");
      code_point = 0x10000 + ((code_point - 0xD800) << 10) + (low - 0xDC00);
    } else if (code_point >= 0xDC00 && code_point <= 0xDFFF) {
      return fail("unpaired surrogate");
    }
    append_utf8(out, code_point);
    return true;
  }

  bool parse_string(std::string& out) {
    ++pos_;  // opening quote
    while (pos_ < text_.size()) {
      const char c = text_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return fail("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= text_.size()) break;
      const char escaped = text_[pos_++];
      switch (escaped) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u':
          if (!parse_unicode_escape(out)) return false;
          break;
        default:
          return fail("invalid escape");
      }
    }
    return fail("unterminated string");
  }

  bool parse_number(JsonValue& value) {
    const std::size_t start = pos_;
    bool integral = true;
    if (pos_ < text_.size() && text_[pos_] == '-') ++pos_;
    const auto digits = [&] {
      const std::size_t first = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
      return pos_ - first;
    };
    const std::size_t integer_start = pos_;
    if (digits() == 0) return fail("invalid value");
    if (text_[integer_start] == '0' && pos_ - integer_start > 1) return fail("leading zero");
    if (pos_ < text_.size() && text_[pos_] == '.') {
      integral = false;
      ++pos_;
      if (digits() == 0) return fail("invalid number");
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      integral = false;
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      if (digits() == 0) return fail("invalid number");
    }
    const std::string literal(text_.substr(start, pos_ - start));
    value.type = JsonValue::Type::number;
    value.number_value = std::strtod(literal.c_str(), nullptr);
    if (integral) {
      errno = 0;
      const long long parsed = std::strtoll(literal.c_str(), nullptr, 10);
      if (errno == 0) {
        value.is_integer = true;
        value.integer_value = parsed;
      }
    }
    return true;
  }

  std::string_view text_;
  std::size_t pos_ = 0;
  std::string error_;
};

}  // namespace

std::optional<JsonValue> parse_json(std::string_view text, std::string& error) {
  return JsonParser(text).parse_document(error);
}

}  // namespace stripe_emulator
