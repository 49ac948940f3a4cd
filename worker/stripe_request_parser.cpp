// Parsing Stripe API requests (see stripe_request_parser.hpp).
#include "stripe_request_parser.hpp"

#include <algorithm>
#include <regex>
#include <string_view>

#include "sha256.hpp"

namespace billguard::proxy {

namespace {

bool IsHex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

// Letters, digits, the punctuation given and well-formed %XX escapes, and
// nothing else; else BadRequest with the message.
void CheckEscaped(const std::string& text, std::string_view punctuation, const char* message) {
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                       punctuation.find(c) != std::string_view::npos;
    if (plain) continue;
    if (c == '%' && i + 2 < text.size() && IsHex(text[i + 1]) && IsHex(text[i + 2])) {
      i += 2;
      continue;
    }
    throw BadRequest(400, "parameter_invalid_encoding", message);
  }
}

// Form encoding as every Stripe client writes it: unreserved characters,
// '+', '*', %XX escapes, '=' and '&' as separators, and '[' and ']', which
// the official stripe-node leaves unescaped in the names of hash and array
// parameters (metadata[k], automatic_payment_methods[enabled]); they are
// literal to the decoder. Nothing else, so no byte can mean something else
// to Stripe than to us.
void CheckFormEncoding(const std::string& text) {
  CheckEscaped(text, "-_.~+*=&[]", "the body is not application/x-www-form-urlencoded");
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return c - 'A' + 10;
}

// One name or value of a form body that CheckFormEncoding passed: '+' is a
// space and %XX the byte XX; nothing else is an escape.
std::string DecodeFormComponent(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '+') {
      out.push_back(' ');
    } else if (text[i] == '%') {
      out.push_back(static_cast<char>(HexValue(text[i + 1]) * 16 + HexValue(text[i + 2])));
      i += 2;
    } else {
      out.push_back(text[i]);
    }
  }
  return out;
}

// A read's query string goes to Stripe as it came: only the characters a
// query may hold unescaped (RFC 3986), and well-formed escapes, so that the
// URL libcurl sends is the one the proxy read.
void CheckQuery(const std::string& query) {
  CheckEscaped(query, "-._~!$&'()*+,;=:@/?[]",
               "the query string holds a character that must be percent-encoded");
}

bool IsNameCharacter(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

// A parameter name as Stripe's clients write it: a plain name, then any
// number of [key] or [] suffixes (metadata[order id], expand[]). Anything
// else is refused: a leading or stray bracket, a space or a NUL is a name
// another parser may read as a different one (Rack 2 reads "[amount]" and
// "amount]" as amount), which the cap would then never have counted.
void CheckParameterName(const std::string& name) {
  std::size_t i = 0;
  while (i < name.size() && IsNameCharacter(name[i])) ++i;
  bool valid = i > 0;
  while (valid && i < name.size()) {
    const std::size_t close = name.find(']', i);
    valid = name[i] == '[' && close != std::string::npos &&
            name.find('[', i + 1) > close;  // no bracket inside a suffix
    i = close + 1;
  }
  if (!valid) {
    throw BadRequest(
        400, "parameter_invalid_encoding",
        "the body holds a parameter name that is not name[key]...: " + name.substr(0, 40));
  }
}

std::vector<std::pair<std::string, std::string>> DecodeForm(const std::string& text) {
  CheckFormEncoding(text);
  std::vector<std::pair<std::string, std::string>> parameters;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('&', start);
    if (end == std::string::npos) end = text.size();
    const std::string pair = text.substr(start, end - start);
    const auto equals = pair.find('=');
    if (!pair.empty()) {
      if (equals == std::string::npos || equals == 0) {
        throw BadRequest(400, "parameter_invalid_encoding",
                         "the body holds a parameter without a name or value");
      }
      std::string name = DecodeFormComponent(pair.substr(0, equals));
      CheckParameterName(name);
      parameters.emplace_back(std::move(name), DecodeFormComponent(pair.substr(equals + 1)));
    }
    start = end + 1;
  }
  return parameters;
}

// The one value of a parameter, or nothing; twice is ambiguous.
std::optional<std::string> Single(const ParsedRequest& r, const std::string& name) {
  std::optional<std::string> found;
  for (const auto& [key, value] : r.parameters) {
    // amount[] or currency[x]: a list or hash some parser may read as the
    // scalar it holds.
    if (key.size() > name.size() && key.compare(0, name.size(), name) == 0 &&
        key[name.size()] == '[') {
      throw BadRequest(400, "parameter_invalid_string", name + " must be a single value");
    }
    if (key != name) continue;
    if (found) throw BadRequest(400, "parameter_duplicated", "Received " + name + " twice.");
    found = value;
  }
  return found;
}

}  // namespace

ParsedRequest ParseStripeRequest(const std::string& method, const std::string& target,
                                 const std::string& content_type, const std::string& body) {
  ParsedRequest r;
  r.method = method;
  const auto question = target.find('?');
  r.path = target.substr(0, question);
  if (question != std::string::npos) r.query = target.substr(question + 1);
  static const std::regex kPath("/v1(/[A-Za-z0-9_]+)+");
  if (!std::regex_match(r.path, kPath)) {
    throw BadRequest(404, "resource_missing",
                     "Unrecognized request URL (" + method + ": " + r.path.substr(0, 200) + ")");
  }
  // A read moves no money: its query string goes to Stripe as it came.
  if (method == "GET") {
    CheckQuery(r.query);
    r.digest = Sha256Hex(method + " " + target);
    return r;
  }
  if (!r.query.empty()) {
    throw BadRequest(400, "parameter_unknown",
                     "the spend-cap proxy takes the parameters of a " + method +
                         " in its body, not in the query string");
  }
  const std::string type = content_type.substr(0, content_type.find(';'));
  if (!body.empty() && type != "application/x-www-form-urlencoded") {
    throw BadRequest(400, "parameter_invalid_encoding",
                     "the body must be application/x-www-form-urlencoded");
  }
  r.parameters = DecodeForm(body);

  if (const auto amount = Single(r, "amount")) {
    // One spelling per number: no leading zero, which a parser may read as octal.
    const bool digits =
        !amount->empty() && amount->size() <= 18 && (*amount)[0] != '0' &&
        std::all_of(amount->begin(), amount->end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!digits) {
      throw BadRequest(400, "parameter_invalid_integer",
                       "Invalid integer: " + amount->substr(0, 40));
    }
    r.amount_cents = std::stoll(*amount);
  }
  r.currency = Single(r, "currency");
  r.customer = Single(r, "customer");

  // Parameters in a canonical order, each length-prefixed so that no two
  // requests share a digest; Stripe compares parameters, not their order.
  auto sorted = r.parameters;
  std::sort(sorted.begin(), sorted.end());
  std::string canonical = method + " " + r.path + "\n";
  for (const auto& [name, value] : sorted) {
    canonical += std::to_string(name.size()) + ":" + name + std::to_string(value.size()) + ":" +
                 value + "\n";
  }
  r.digest = Sha256Hex(canonical);
  return r;
}

}  // namespace billguard::proxy
