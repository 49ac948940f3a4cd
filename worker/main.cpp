// billguard-proxy: the spend-cap proxy. Holds the real Stripe key, issues
// per-period vault keys and refuses any charge that would take a period past
// its cap. Thin on purpose: every decision is one call of the ledger in the
// database (ledger.hpp); this program parses, authenticates, calls,
// forwards and relays.
#include <signal.h>
#include <sys/resource.h>

#include <cstdio>
#include <optional>
#include <thread>

#include "api_base.hpp"
#include "api_key.hpp"
#include "command_line.hpp"
#include "forwarding.hpp"
#include "http_server.hpp"
#include "keys_api.hpp"
#include "reconciler.hpp"
#include "router.hpp"
#include "secret_flags.hpp"
#include "stripe_errors.hpp"
#include "webhooks.hpp"

namespace bp = billguard::proxy;

namespace {

// Every connection is a descriptor: as many as the hard limit allows.
// Returns the limit in force.
rlim_t RaiseDescriptorLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return RLIM_INFINITY;
  if (limit.rlim_cur < limit.rlim_max) {
    const rlim_t before = limit.rlim_cur;
    limit.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &limit) != 0) limit.rlim_cur = before;
  }
  return limit.rlim_cur;
}

// Client connections may never take the descriptors the ledger's and
// Stripe's connections need: clients holding every one would turn each
// charge into a 503 or a 502.
std::size_t ConnectionBound(const bp::Options& options, rlim_t descriptors) {
  const auto wanted = static_cast<std::size_t>(options.max_connections);
  const rlim_t reserved = 4 * static_cast<rlim_t>(options.database_pool) +
                          2 * static_cast<rlim_t>(options.threads) + 64;
  if (descriptors == RLIM_INFINITY || descriptors >= reserved + wanted) return wanted;
  const std::size_t bound = descriptors > reserved + 16 ? descriptors - reserved : 16;
  std::fprintf(stderr,
               "billguard-proxy: serving at most %zu connections, not --max-connections %zu: "
               "the descriptor limit is %llu\n",
               bound, wanted, static_cast<unsigned long long>(descriptors));
  return bound;
}

// A Stripe secret or restricted key: a vault key upstream would send every
// charge through a second proxy's cap.
std::string ReadUpstreamKey(const std::string& path) {
  const std::string key = bp::ReadSecretFlag("--upstream-key-file", path);
  if (!billguard::IsStripeKey(key) || key.compare(0, 3, "vk_") == 0) {
    throw bp::StartupError("--upstream-key-file " + path +
                           " does not hold a Stripe key (sk_... or rk_...)");
  }
  return key;
}

void ServeHealthAndMetrics(bp::Router& router, bp::ProxyContext& context) {
  router.Get("/healthz", [&](const bp::Request&, bp::Response& res) {
    try {
      context.ledger.Ping();
      bp::AnswerJson(res, 200, R"({"status":"ok"})");
    } catch (const std::exception&) {
      bp::AnswerJson(res, 503, R"({"status":"database unavailable"})");
    }
  });
  router.Get("/metrics", [&](const bp::Request&, bp::Response& res) {
    std::optional<std::vector<bp::Row>> budgets;
    try {
      budgets = context.ledger.Spend();
    } catch (const std::exception&) {
      // Rendered without the budgets; billguard_proxy_ledger_up says why.
    }
    res.set_content(context.metrics.Render(budgets ? &*budgets : nullptr),
                    "text/plain; version=0.0.4");
  });
}

bp::HttpServerOptions ServerOptions(const bp::Options& options) {
  bp::HttpServerOptions server;
  server.host = options.listen_host;
  server.port = options.listen_port;
  server.worker_threads = static_cast<std::size_t>(options.threads);
  server.header_timeout = std::chrono::seconds(options.header_timeout_s);
  server.body_timeout = std::chrono::seconds(options.body_timeout_s);
  server.idle_timeout = std::chrono::seconds(options.idle_timeout_s);
  return server;
}

}  // namespace

int main(int argc, char** argv) {
  bp::Options options;
  try {
    options = bp::ParseCommandLine(argc, argv);
  } catch (const bp::UsageError& e) {
    std::fprintf(stderr, "billguard-proxy: %s\n%s", e.what(), bp::kUsage);
    return 2;
  }
  if (options.help) {
    std::fputs(bp::kUsage, stdout);
    return 0;
  }

  // SIGTERM and SIGINT are taken by one thread that stops the server; every
  // other thread inherits the blocked mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  try {
    if (const std::string why = billguard::ApiBaseError(options.upstream); !why.empty()) {
      // A URL refused for its user info may carry a key in it: not echoed then.
      const bool may_hold_secret = options.upstream.find('@') != std::string::npos;
      throw bp::StartupError("--upstream " + (may_hold_secret ? "" : options.upstream + " ") +
                             "is refused. " + why);
    }
    const std::string upstream_key = ReadUpstreamKey(options.upstream_key_file);
    const std::string admin_token =
        bp::ReadTokenFile("--admin-token-file", options.admin_token_file);
    std::optional<std::string> issuer_token;
    if (!options.issuer_token_file.empty()) {
      issuer_token = bp::ReadTokenFile("--issuer-token-file", options.issuer_token_file);
    }
    bp::Metrics metrics;
    bp::LedgerPolicy policy;
    policy.idempotency_window_s = options.idempotency_window_s;
    policy.reconcile_after_s = options.reconcile_after_s;
    policy.issuer_max_key_days = options.issuer_max_key_days;
    policy.issuer_period_months = options.issuer_period_months;
    bp::Ledger ledger(options.database, static_cast<std::size_t>(options.database_pool), policy,
                      metrics.ledger_counters());
    ledger.CheckSchema();
    std::optional<bp::WebhookInbox> webhooks;
    if (!options.webhook_database.empty()) {
      webhooks.emplace(options.webhook_database, static_cast<std::size_t>(options.database_pool));
      webhooks->CheckSchema();
    }
    billguard::InitializeHttp();
    const bp::Upstream upstream(options.upstream, upstream_key, options.upstream_timeout_s * 1000L);
    // Reservations in doubt, looked up at Stripe from the start on.
    const bp::Reconciler reconciler(ledger, upstream);
    bp::ProxyContext context{ledger,
                             upstream,
                             metrics,
                             admin_token,
                             issuer_token,
                             options.issuer_max_period_usd,
                             options.issuer_max_period,
                             upstream_key.find("_live_") != std::string::npos};

    bp::Router router;
    const auto forward = [&](const bp::Request& req, bp::Response& res) {
      bp::HandleStripeRequest(context, req, res);
    };
    router.Get("/v1/.*", forward);
    router.Post("/v1/.*", forward);
    router.Delete("/v1/.*", forward);
    bp::RegisterKeysApi(router, context);
    if (webhooks) bp::RegisterWebhookEndpoint(router, *webhooks, metrics);
    ServeHealthAndMetrics(router, context);

    bp::HttpServerOptions server_options = ServerOptions(options);
    server_options.max_connections = ConnectionBound(options, RaiseDescriptorLimit());
    bp::HttpServer server(
        server_options, [&](bp::Request& req, bp::Response& res) { router.Dispatch(req, res); },
        // What the HTTP layer refuses is bad input too.
        [&](int status) { metrics.CountRequest("rejected", status); });
    const int port = server.port();
    std::thread stopper([&] {
      int signal_number = 0;
      sigwait(&stop_signals, &signal_number);
      server.Stop();
    });
    stopper.detach();
    std::printf("listening on %s:%d\n", options.listen_host.c_str(), port);
    std::fflush(stdout);
    std::fprintf(stderr, "billguard-proxy: serving on %s:%d, upstream %s\n",
                 options.listen_host.c_str(), port, options.upstream.c_str());
    server.Run();
  } catch (const std::exception& e) {
    // A StartupError says why in one line; anything else is cut to its first.
    const std::string message = e.what();
    std::fprintf(stderr, "billguard-proxy: %s\n", message.substr(0, message.find('\n')).c_str());
    return 1;
  }
  return 0;
}
