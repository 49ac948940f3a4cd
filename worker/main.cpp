// billguard-proxy: the spend-cap proxy. Holds the real Stripe key, issues
// per-period vault keys and refuses any charge that would take a period past
// its cap. Thin on purpose: every decision is one call of the ledger in the
// database (ledger.hpp); this program parses, authenticates, calls,
// forwards and relays.
#include <httplib.h>
#include <signal.h>
#include <sys/socket.h>

#include <cstdio>
#include <optional>
#include <thread>

#include "api_base.hpp"
#include "api_key.hpp"
#include "command_line.hpp"
#include "forwarding.hpp"
#include "keys_api.hpp"
#include "reconciler.hpp"
#include "secret_flags.hpp"
#include "stripe_errors.hpp"
#include "webhooks.hpp"

namespace bp = billguard::proxy;

namespace {

// Limits on what a client may send: Stripe's requests are small.
constexpr std::size_t kMaxBodyBytes = 64 * 1024;

// Debian's cpp-httplib is built to listen with a backlog of 5: a burst of
// new connections would then wait for SYN retransmits, or be dropped. The
// socket's backlog can be raised once it listens.
class Server : public httplib::Server {
 public:
  void WidenBacklog() { ::listen(svr_sock_, SOMAXCONN); }
};

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

void ServeHealthAndMetrics(httplib::Server& server, bp::ProxyContext& context) {
  server.Get("/healthz", [&](const httplib::Request&, httplib::Response& res) {
    try {
      context.ledger.Ping();
      bp::AnswerJson(res, 200, R"({"status":"ok"})");
    } catch (const std::exception&) {
      bp::AnswerJson(res, 503, R"({"status":"database unavailable"})");
    }
  });
  server.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
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

// Every answer the library makes itself (unknown path, body too large,
// malformed request) is a Stripe-shaped error too.
void AnswerLibraryErrors(httplib::Server& server) {
  server.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string message =
        "Unrecognized request URL (" + req.method + ": " + req.path.substr(0, 200) + ")";
    if (res.status == 413) message = "request body larger than 64 KiB";
    if (res.status == 400) message = "malformed HTTP request";
    bp::AnswerJson(res, res.status,
                   bp::StripeErrorBody("invalid_request_error",
                                       res.status == 404 ? "resource_missing" : "", message));
  });
  server.set_exception_handler([](const httplib::Request&, httplib::Response& res,
                                  std::exception_ptr) {
    bp::AnswerJson(res, 500, bp::StripeErrorBody("api_error", "", "the spend-cap proxy failed"));
  });
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
                             upstream_key.find("_live_") != std::string::npos};

    Server server;
    const auto threads = static_cast<std::size_t>(options.threads);
    server.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    server.set_payload_max_length(kMaxBodyBytes);
    server.set_keep_alive_max_count(10000);
    server.set_tcp_nodelay(true);
    const auto forward = [&](const httplib::Request& req, httplib::Response& res) {
      bp::HandleStripeRequest(context, req, res);
    };
    server.Get("/v1/.*", forward);
    server.Post("/v1/.*", forward);
    server.Delete("/v1/.*", forward);
    bp::RegisterKeysApi(server, context);
    if (webhooks) bp::RegisterWebhookEndpoint(server, *webhooks, metrics);
    ServeHealthAndMetrics(server, context);
    AnswerLibraryErrors(server);

    int port = options.listen_port;
    if (port == 0) {
      port = server.bind_to_any_port(options.listen_host);
    } else if (!server.bind_to_port(options.listen_host, port)) {
      port = -1;
    }
    if (port < 0)
      throw bp::StartupError("cannot listen on " + options.listen_host + ":" +
                             std::to_string(options.listen_port));
    server.WidenBacklog();
    std::thread stopper([&] {
      int signal_number = 0;
      sigwait(&stop_signals, &signal_number);
      server.stop();
    });
    stopper.detach();
    std::printf("listening on %s:%d\n", options.listen_host.c_str(), port);
    std::fflush(stdout);
    std::fprintf(stderr, "billguard-proxy: serving on %s:%d, upstream %s\n",
                 options.listen_host.c_str(), port, options.upstream.c_str());
    server.listen_after_bind();
  } catch (const std::exception& e) {
    // A StartupError says why in one line; anything else is cut to its first.
    const std::string message = e.what();
    std::fprintf(stderr, "billguard-proxy: %s\n", message.substr(0, message.find('\n')).c_str());
    return 1;
  }
  return 0;
}
