#include "emulator_command_line.hpp"

namespace stripe_emulator {

namespace {

bool parse_count(const std::string& text, std::int64_t maximum, std::int64_t& out) {
  if (text.empty() || text.size() > 12 ||
      text.find_first_not_of("0123456789") != std::string::npos) {
    return false;
  }
  const long long value = std::stoll(text);
  if (value > maximum) return false;
  out = value;
  return true;
}

// HOST:PORT, where HOST may be a bracketed IPv6 literal: [::1]:8080.
bool parse_listen_address(const std::string& text, Options& options) {
  const std::size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  std::string host = text.substr(0, colon);
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return false;
    host = host.substr(1, host.size() - 2);
  }
  std::int64_t port;
  if (!parse_count(text.substr(colon + 1), 65535, port)) return false;
  options.listen_host = host;
  options.listen_port = static_cast<std::uint16_t>(port);
  return true;
}

}  // namespace

const char* usage_text() {
  return "usage: billguard-stripe-emulator --listen HOST:PORT [options]\n"
         "\n"
         "A stateful local stand-in for the Stripe API (PaymentIntents, Charges,\n"
         "list, search) with Stripe's idempotency semantics, for billguard's tests.\n"
         "Prints \"listening on HOST:PORT\" once ready (PORT 0 picks a free port).\n"
         "\n"
         "options:\n"
         "  --listen HOST:PORT         address to listen on (required)\n"
         "  --idempotency-ttl SECONDS  age after which idempotency keys are pruned (default "
         "86400)\n"
         "  --rate-limit PER_SECOND    at most this many /v1 requests in any 1 s window (0 = off, "
         "default)\n"
         "  --latency-ms N             delay every /v1 request by N ms (default 0)\n"
         "  --api-key KEY              accept only this bearer key (default: any non-empty key)\n"
         "  --search-delay-ms N        objects become searchable N ms after creation (default 0)\n"
         "  --api-version YYYY-MM-DD   the account's API version, for requests without\n"
         "                             Stripe-Version (default 2020-08-27); from 2023-08-16 a\n"
         "                             confirmed PaymentIntent that names neither\n"
         "                             payment_method_types nor automatic_payment_methods\n"
         "                             [allow_redirects]=never needs a return_url\n"
         "  --webhook-url URL          send signed webhook events to this http:// endpoint\n"
         "  --webhook-secret SECRET    the endpoint's signing secret (whsec_...), needed with\n"
         "                             --webhook-url\n"
         "  --quiet                    no per-request log lines on stderr\n"
         "  --help                     show this help\n"
         "\n"
         "Control API (loopback clients only): GET /_emulator/ledger, POST|GET /_emulator/faults,\n"
         "POST /_emulator/reset, GET /_emulator/stats, POST|GET /_emulator/config,\n"
         "POST|GET /_emulator/webhooks, POST /_emulator/webhooks/resend, POST "
         "/_emulator/refunds.\n";
}

CommandLineVerdict parse_command_line(int argc, char** argv, Options& options, std::string& error) {
  bool saw_listen = false;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    std::optional<std::string> inline_value;
    if (const std::size_t equals = flag.find('=');
        flag.rfind("--", 0) == 0 && equals != std::string::npos) {
      inline_value = flag.substr(equals + 1);  // --flag=value
      flag = flag.substr(0, equals);
    }
    if (flag == "--help" || flag == "-h") return CommandLineVerdict::show_help;
    if (flag == "--quiet") {
      if (inline_value) {
        error = "--quiet takes no value";
        return CommandLineVerdict::usage_error;
      }
      options.quiet = true;
      continue;
    }

    static const char* const kValueFlags[] = {
        "--listen",  "--idempotency-ttl", "--rate-limit",     "--latency-ms", "--search-delay-ms",
        "--api-key", "--webhook-url",     "--webhook-secret", "--api-version"};
    bool known = false;
    for (const char* value_flag : kValueFlags) known = known || flag == value_flag;
    if (!known) {
      error = "unknown option " + flag;
      return CommandLineVerdict::usage_error;
    }

    std::string value;
    if (inline_value) {
      value = *inline_value;
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      error = flag + " needs a value";
      return CommandLineVerdict::usage_error;
    }

    bool valid = true;
    if (flag == "--listen") {
      valid = parse_listen_address(value, options);
      saw_listen = valid;
    } else if (flag == "--idempotency-ttl") {
      valid = parse_count(value, 315360000, options.idempotency_ttl_seconds);
    } else if (flag == "--rate-limit") {
      valid = parse_count(value, 1000000000, options.rate_limit_per_second);
    } else if (flag == "--latency-ms") {
      valid = parse_count(value, 600000, options.latency_ms);
    } else if (flag == "--search-delay-ms") {
      valid = parse_count(value, 86400000, options.search_delay_ms);
    } else if (flag == "--api-version") {
      valid = value.size() >= 10 && value[4] == '-' && value[7] == '-' &&
              value.substr(0, 4).find_first_not_of("0123456789") == std::string::npos &&
              value.substr(5, 2).find_first_not_of("0123456789") == std::string::npos &&
              value.substr(8, 2).find_first_not_of("0123456789") == std::string::npos;
      options.api_version = value;
    } else if (flag == "--webhook-url") {
      valid = value.rfind("http://", 0) == 0;
      options.webhook_url = value;
    } else if (flag == "--webhook-secret") {
      valid = !value.empty();
      options.webhook_secret = value;
    } else {  // --api-key
      valid = !value.empty();
      options.api_key = value;
    }
    if (!valid) {
      // The API key and the webhook secret are secrets: name the flag, not the value.
      const bool secret = flag == "--api-key" || flag == "--webhook-secret";
      error = "invalid value for " + flag + (secret ? std::string() : ": " + value);
      return CommandLineVerdict::usage_error;
    }
  }
  if (!saw_listen) {
    error = "--listen HOST:PORT is required";
    return CommandLineVerdict::usage_error;
  }
  if (options.webhook_url.empty() != options.webhook_secret.empty()) {
    error = "--webhook-url and --webhook-secret go together";
    return CommandLineVerdict::usage_error;
  }
  return CommandLineVerdict::run;
}

}  // namespace stripe_emulator
