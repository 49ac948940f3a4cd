// The emulator's command line. Tests and tools outside this repository rely
// on these exact flags, so they are fixed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace stripe_emulator {

struct Options {
  std::string listen_host;  // brackets of an IPv6 literal removed
  std::uint16_t listen_port = 0;
  std::int64_t idempotency_ttl_seconds = 86400;
  std::int64_t rate_limit_per_second = 0;  // 0: off
  std::int64_t latency_ms = 0;
  std::optional<std::string> api_key;  // nullopt: any non-empty bearer key
  std::int64_t search_delay_ms = 0;
  std::string api_version = "2020-08-27";  // for requests without Stripe-Version
  std::string webhook_url;                 // empty: no webhooks are sent
  std::string webhook_secret;
  bool quiet = false;
};

enum class CommandLineVerdict { run, show_help, usage_error };

// On usage_error, `error` says what was wrong.
CommandLineVerdict parse_command_line(int argc, char** argv, Options& options, std::string& error);

const char* usage_text();

}  // namespace stripe_emulator
