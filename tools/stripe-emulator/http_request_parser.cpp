#include "http_request_parser.hpp"

#include <cctype>

namespace stripe_emulator {

namespace {

std::string_view trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

std::string lower_case(std::string_view text) {
  std::string lowered(text);
  for (auto& c : lowered) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return lowered;
}

bool is_token(std::string_view text) {
  if (text.empty()) return false;
  for (const char c : text) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u >= 0x7F || c == ':' || c == '(' || c == ')' || c == ',' || c == '"' ||
        c == '/' || c == '[' || c == ']' || c == '?' || c == '=' || c == '{' || c == '}' ||
        c == '\\' || c == ';' || c == '<' || c == '>' || c == '@') {
      return false;
    }
  }
  return true;
}

// Whether a comma-separated header value (Connection) lists `token`.
bool lists_token(std::string_view value, std::string_view token) {
  std::size_t start = 0;
  while (start <= value.size()) {
    std::size_t comma = value.find(',', start);
    if (comma == std::string_view::npos) comma = value.size();
    if (lower_case(trim(value.substr(start, comma - start))) == token) return true;
    start = comma + 1;
  }
  return false;
}

HeadParseResult failure(HeadProblem problem, std::string detail) {
  HeadParseResult result;
  result.problem = problem;
  result.detail = std::move(detail);
  return result;
}

bool parse_request_line(std::string_view line, HttpRequest& request, std::string& detail) {
  const std::size_t first_space = line.find(' ');
  const std::size_t second_space =
      first_space == std::string_view::npos ? first_space : line.find(' ', first_space + 1);
  if (second_space == std::string_view::npos ||
      line.find(' ', second_space + 1) != std::string_view::npos) {
    detail = "malformed request line";
    return false;
  }
  request.method = std::string(line.substr(0, first_space));
  request.target = std::string(line.substr(first_space + 1, second_space - first_space - 1));
  request.version = std::string(line.substr(second_space + 1));
  if (!is_token(request.method)) {
    detail = "malformed method";
    return false;
  }
  if (request.target.empty() || request.target.front() != '/') {
    detail = "request target must be an absolute path";
    return false;
  }
  const std::size_t question = request.target.find('?');
  request.path = request.target.substr(0, question);
  if (question != std::string::npos) request.query = request.target.substr(question + 1);
  return true;
}

}  // namespace

HeadParseResult parse_request_head(std::string_view head) {
  HeadParseResult result;
  RequestHead& parsed = result.head;
  HttpRequest& request = parsed.request;

  std::size_t line_end = head.find("\r\n");
  const std::string_view request_line = head.substr(0, line_end);
  std::string detail;
  if (!parse_request_line(request_line, request, detail)) {
    return failure(HeadProblem::malformed, detail);
  }
  if (request.version != "HTTP/1.1" && request.version != "HTTP/1.0") {
    if (request.version.compare(0, 5, "HTTP/") == 0) {
      return failure(HeadProblem::unsupported_version, "only HTTP/1.0 and HTTP/1.1 are supported");
    }
    return failure(HeadProblem::malformed, "malformed HTTP version");
  }

  bool saw_content_length = false;
  while (line_end != std::string_view::npos) {
    const std::size_t line_start = line_end + 2;
    line_end = head.find("\r\n", line_start);
    const std::string_view line = head.substr(line_start, line_end - line_start);
    if (line.empty()) continue;
    if (line.front() == ' ' || line.front() == '\t') {
      return failure(HeadProblem::malformed, "obsolete header line folding");
    }
    const std::size_t colon = line.find(':');
    if (colon == std::string_view::npos || !is_token(line.substr(0, colon))) {
      return failure(HeadProblem::malformed, "malformed header field");
    }
    std::string name = lower_case(line.substr(0, colon));
    std::string value(trim(line.substr(colon + 1)));

    if (name == "content-length") {
      if (value.empty() || value.size() > 18 ||
          value.find_first_not_of("0123456789") != std::string::npos) {
        return failure(HeadProblem::malformed, "invalid Content-Length");
      }
      const std::size_t length = std::stoull(value);
      if (saw_content_length && length != parsed.content_length) {
        return failure(HeadProblem::malformed, "conflicting Content-Length headers");
      }
      saw_content_length = true;
      parsed.content_length = length;
    } else if (name == "transfer-encoding") {
      return failure(HeadProblem::chunked_body,
                     "Transfer-Encoding is not supported; send a Content-Length");
    }
    request.headers.emplace_back(std::move(name), std::move(value));
  }

  // HTTP/1.1 keeps connections open unless told otherwise; 1.0 only if asked.
  const std::string* connection = request.header("connection");
  if (request.version == "HTTP/1.1") {
    parsed.keep_alive = !(connection && lists_token(*connection, "close"));
  } else {
    parsed.keep_alive = connection && lists_token(*connection, "keep-alive");
  }
  const std::string* expect = request.header("expect");
  parsed.expects_continue = expect && lower_case(*expect) == "100-continue";
  return result;
}

}  // namespace stripe_emulator
