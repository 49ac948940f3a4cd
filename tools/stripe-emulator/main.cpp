// billguard-stripe-emulator: entry point. Parses flags, starts listening,
// announces the port, and exits 0 on SIGTERM/SIGINT.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <string>
#include <thread>

#include "emulator_command_line.hpp"
#include "emulator_state.hpp"
#include "threaded_http_server.hpp"
#include "request_router.hpp"

using namespace stripe_emulator;

int main(int argc, char** argv) {
  Options options;
  std::string error;
  switch (parse_command_line(argc, argv, options, error)) {
    case CommandLineVerdict::show_help:
      std::fputs(usage_text(), stdout);
      return 0;
    case CommandLineVerdict::usage_error:
      std::fprintf(stderr, "billguard-stripe-emulator: %s\n\n%s", error.c_str(), usage_text());
      return 2;
    case CommandLineVerdict::run:
      break;
  }

  // Block the stop signals in every thread (threads inherit the mask) and
  // wait for them synchronously below: no async-signal-safety concerns, and
  // a stop is noticed at once whatever the connection threads are doing.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client hanging up must not kill the emulator

  static EmulatorState state(options.rate_limit_per_second, !options.quiet);
  state.required_api_key = options.api_key;
  state.default_api_version = options.api_version;
  state.settings.latency_ms = options.latency_ms;
  state.settings.search_delay_ms = options.search_delay_ms;
  state.settings.idempotency_ttl_seconds = options.idempotency_ttl_seconds;
  WebhookSettings webhooks;
  webhooks.url = options.webhook_url;
  webhooks.secret = options.webhook_secret;
  if (!state.webhooks.configure(webhooks, error)) {
    std::fprintf(stderr, "billguard-stripe-emulator: %s\n\n%s", error.c_str(), usage_text());
    return 2;
  }
  static RequestRouter router(state);
  static HttpServer server([](const HttpRequest& request) { return router.route(request); },
                           !options.quiet);

  std::uint16_t port;
  try {
    port = server.listen_on(options.listen_host, options.listen_port);
  } catch (const std::exception& failure) {
    std::fprintf(stderr, "billguard-stripe-emulator: %s\n", failure.what());
    return 1;
  }
  const bool ipv6_literal = options.listen_host.find(':') != std::string::npos;
  std::printf(ipv6_literal ? "listening on [%s]:%u\n" : "listening on %s:%u\n",
              options.listen_host.c_str(), static_cast<unsigned>(port));
  std::fflush(stdout);

  std::thread([] { server.serve_forever(); }).detach();
  std::thread([] { state.webhooks.run(); }).detach();

  int received = 0;
  while (sigwait(&stop_signals, &received) != 0) {
  }
  // Connection threads may be mid-request; ending the process without
  // running destructors under them is the prompt, safe way out.
  std::fflush(stderr);
  _exit(0);
}
