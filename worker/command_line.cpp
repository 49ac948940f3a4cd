// billguard-proxy's command line (see command_line.hpp).
#include "command_line.hpp"

#include <cstdlib>
#include <map>

namespace billguard::proxy {

const char* const kUsage =
    "usage: billguard-proxy --listen HOST:PORT --database CONNINFO --upstream URL\n"
    "                       --upstream-key-file PATH --admin-token-file PATH\n"
    "                       [--issuer-token-file PATH --issuer-max-period-usd AMOUNT\n"
    "                        --issuer-max-period AMOUNT:CURRENCY ...]\n"
    "                       [--webhook-database CONNINFO]\n"
    "                       [--upstream-timeout SECONDS] [--threads N] [--database-pool N]\n"
    "                       [--idempotency-window SECONDS] [--reconcile-after SECONDS]\n"
    "                       [--issuer-max-key-days DAYS] [--issuer-period-months N]\n"
    "                       [--max-connections N] [--header-timeout SECONDS]\n"
    "                       [--body-timeout SECONDS] [--idle-timeout SECONDS]\n"
    "       billguard-proxy --help\n"
    "\n"
    "The spend-cap proxy: holds the real Stripe key, issues per-period vault keys\n"
    "and refuses any charge that would take a period past its cap. Every decision\n"
    "is a call of the billguard extension's ledger in the --database.\n"
    "\n"
    "  --listen HOST:PORT        address to serve (PORT 0: any free port); prints\n"
    "                            \"listening on HOST:PORT\" once it accepts connections\n"
    "  --database CONNINFO       libpq connection string of the database that holds\n"
    "                            the ledger (CREATE EXTENSION billguard, 0.3.0 or later)\n"
    "  --upstream URL            the Stripe API, e.g. https://api.stripe.com\n"
    "                            (http:// only to a loopback host)\n"
    "  --upstream-key-file PATH  the real Stripe key (sk_... or rk_...)\n"
    "  --admin-token-file PATH   token that issues keys, reads and revokes them and\n"
    "                            raises caps\n"
    "  --issuer-token-file PATH  token that may only issue keys, and only what the\n"
    "                            billing database's dispatcher asks for: vendor\n"
    "                            stripe, endpoints among /v1/payment_intents,\n"
    "                            /v1/charges and their /search, and a new budget of\n"
    "                            at most its currency's ceiling (it may join an\n"
    "                            existing budget at its cap); anything else is 403\n"
    "                            issuer_not_allowed. Larger budgets are the admin's\n"
    "  --issuer-max-period-usd AMOUNT\n"
    "                            the largest cap in USD (e.g. 5000.00) of a budget\n"
    "                            the issuer token creates\n"
    "  --issuer-max-period AMOUNT:CURRENCY\n"
    "                            the same in another currency, in its major unit\n"
    "                            and exact in its minor units (4000.00:eur,\n"
    "                            600000:jpy, 1500.500:kwd); repeat it per currency.\n"
    "                            A currency without a ceiling gets no new budget\n"
    "                            from the issuer token (403 issuer_not_allowed).\n"
    "                            --issuer-token-file needs at least one ceiling\n"
    "  --webhook-database CONNINFO\n"
    "                            the billing database: serve POST /webhooks/stripe,\n"
    "                            Stripe's webhook deliveries, passed to its\n"
    "                            billguard.ingest_stripe_event() (no vault key: the\n"
    "                            database checks Stripe's signature)\n"
    "  --upstream-timeout S      seconds to wait for Stripe before answering 502 (20)\n"
    "  --threads N               requests decided at once (64): worker threads that\n"
    "                            make the ledger's and Stripe's calls. A connection\n"
    "                            holds one only from its complete request to its\n"
    "                            answer, never while its client is slow\n"
    "  --database-pool N         connections to each database (8)\n"
    "  --idempotency-window S    how long Stripe is trusted to remember an\n"
    "                            Idempotency-Key (82800, 23 h; at most 86400): a key\n"
    "                            still reserved past it is looked up at Stripe\n"
    "                            before anything is forwarded; until its outcome is\n"
    "                            known it is answered 409 reservation_reconciling\n"
    "  --reconcile-after S       quiet time after a key's last attempt before\n"
    "                            Stripe's silence about it counts, and the proxy\n"
    "                            looks up by itself every reservation in doubt that\n"
    "                            long (120; at least --upstream-timeout)\n"
    "  --issuer-max-key-days N   the issuer token's keys expire within N days (100)\n"
    "  --issuer-period-months N  the issuer token's keys name billing periods at\n"
    "                            most N months from the current one, UTC (1: the\n"
    "                            previous, the current and the next)\n"
    "  --max-connections N       client connections open at once (10000; at most the\n"
    "                            descriptor limit less what the database and Stripe\n"
    "                            connections need); one more is closed as it arrives\n"
    "  --header-timeout S        seconds from a request's first byte to the end of\n"
    "                            its headers (10); then 408 and the connection closes\n"
    "  --body-timeout S          seconds from the end of the headers to the end of\n"
    "                            the body (10); then 408\n"
    "  --idle-timeout S          seconds a kept-alive connection may wait for its\n"
    "                            next request (60)\n"
    "\n"
    "Secret files must be readable by their owner only (chmod 600); tokens are at\n"
    "least 24 characters.\n"
    "\n"
    "A request has at most 8 KiB of request line and headers in at most 64 lines,\n"
    "and a body of at most 64 KiB whatever its framing (431, 413 past them); header\n"
    "values are taken as sent, never decoded; a control character or line fold in\n"
    "one, a second Idempotency-Key, Stripe-Version, Authorization, Content-Length or\n"
    "Transfer-Encoding, a Transfer-Encoding but chunked, or a Content-Encoding but\n"
    "identity is refused (4xx) and forwards nothing.\n"
    "\n"
    "HTTP: POST /keys, GET|DELETE|POST /keys/{key_id} (admin), /v1/... with\n"
    "Authorization: Bearer vk_..., POST /webhooks/stripe (with --webhook-database),\n"
    "GET /healthz, GET /metrics.\n";

namespace {

int ParseInt(const std::string& flag, const std::string& value, int low, int high) {
  char* end = nullptr;
  const long n = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || n < low || n > high) {
    throw UsageError(flag + " must be an integer " + std::to_string(low) + ".." +
                     std::to_string(high) + ", got \"" + value + "\"");
  }
  return static_cast<int>(n);
}

// A positive USD amount of whole cents, up to the ledger's largest cap
// (10000000000000), as the decimal text the ledger reads.
std::string ParseUsd(const std::string& flag, const std::string& value) {
  const std::size_t point = value.find('.');
  const std::string whole = value.substr(0, point);
  const std::string cents = point == std::string::npos ? "" : value.substr(point + 1);
  const auto digits = [](const std::string& text) {
    return text.find_first_not_of("0123456789") == std::string::npos;
  };
  const double usd = std::strtod(value.c_str(), nullptr);
  const bool valid = !whole.empty() && whole.size() <= 14 && digits(whole) && digits(cents) &&
                     (point == std::string::npos || (cents.size() >= 1 && cents.size() <= 2)) &&
                     usd > 0 && usd <= 1e13;
  if (!valid) {
    throw UsageError(flag + " must be a positive USD amount of whole cents up to " +
                     "10000000000000, e.g. 5000.00, got \"" + value + "\"");
  }
  return value;
}

// AMOUNT:CURRENCY of --issuer-max-period: a lower-case ISO 4217 code and a
// positive decimal with at most three decimals, up to the ledger's largest
// cap; the ledger checks it against the currency's minor units.
std::pair<std::string, std::string> ParseCeiling(const std::string& value) {
  const std::size_t colon = value.rfind(':');
  const std::string amount = value.substr(0, colon == std::string::npos ? 0 : colon);
  const std::string currency = colon == std::string::npos ? "" : value.substr(colon + 1);
  const std::size_t point = amount.find('.');
  const std::string whole = amount.substr(0, point);
  const std::string fraction = point == std::string::npos ? "" : amount.substr(point + 1);
  const auto only = [](const std::string& text, const char* allowed) {
    return text.find_first_not_of(allowed) == std::string::npos;
  };
  const bool valid = currency.size() == 3 && only(currency, "abcdefghijklmnopqrstuvwxyz") &&
                     !whole.empty() && whole.size() <= 16 && only(whole, "0123456789") &&
                     only(fraction, "0123456789") &&
                     (point == std::string::npos || (!fraction.empty() && fraction.size() <= 3)) &&
                     std::strtod(amount.c_str(), nullptr) > 0;
  if (!valid) {
    throw UsageError(
        "--issuer-max-period must be AMOUNT:CURRENCY, a positive amount in the currency's major "
        "unit and its lower-case ISO 4217 code (4000.00:eur, 600000:jpy), got \"" +
        value + "\"");
  }
  return {currency, amount};
}

}  // namespace

Options ParseCommandLine(int argc, char** argv) {
  Options options;
  std::map<std::string, std::string> values;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      options.help = true;
      return options;
    }
    static const char* const kFlags[] = {"--listen",
                                         "--database",
                                         "--upstream",
                                         "--upstream-key-file",
                                         "--admin-token-file",
                                         "--issuer-token-file",
                                         "--upstream-timeout",
                                         "--threads",
                                         "--database-pool",
                                         "--webhook-database",
                                         "--issuer-max-period-usd",
                                         "--issuer-max-period",
                                         "--idempotency-window",
                                         "--reconcile-after",
                                         "--issuer-max-key-days",
                                         "--issuer-period-months",
                                         "--max-connections",
                                         "--header-timeout",
                                         "--body-timeout",
                                         "--idle-timeout"};
    bool known = false;
    for (const char* name : kFlags) known = known || flag == name;
    if (!known) throw UsageError("unknown option " + flag);
    if (i + 1 >= argc) throw UsageError(flag + " needs a value");
    if (flag == "--issuer-max-period") {
      const auto [currency, amount] = ParseCeiling(argv[++i]);
      if (!options.issuer_max_period.emplace(currency, amount).second) {
        throw UsageError("--issuer-max-period names " + currency + " twice");
      }
      continue;
    }
    if (values.count(flag) != 0) throw UsageError(flag + " is given twice");
    values[flag] = argv[++i];
  }
  for (const char* required :
       {"--listen", "--database", "--upstream", "--upstream-key-file", "--admin-token-file"}) {
    if (values.count(required) == 0) throw UsageError(std::string(required) + " is required");
  }
  const std::string& listen = values["--listen"];
  const auto colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    throw UsageError("--listen must be HOST:PORT, got \"" + listen + "\"");
  }
  options.listen_host = listen.substr(0, colon);
  options.listen_port = ParseInt("--listen's PORT", listen.substr(colon + 1), 0, 65535);
  options.database = values["--database"];
  options.upstream = values["--upstream"];
  options.upstream_key_file = values["--upstream-key-file"];
  options.admin_token_file = values["--admin-token-file"];
  if (values.count("--issuer-token-file") != 0) {
    options.issuer_token_file = values["--issuer-token-file"];
    if (values.count("--issuer-max-period-usd") == 0 && options.issuer_max_period.empty()) {
      throw UsageError(
          "--issuer-token-file needs --issuer-max-period-usd or --issuer-max-period, the largest "
          "budget the issuer token may create (per currency)");
    }
    if (values.count("--issuer-max-period-usd") != 0) {
      options.issuer_max_period_usd =
          ParseUsd("--issuer-max-period-usd", values["--issuer-max-period-usd"]);
      if (options.issuer_max_period.count("usd") != 0) {
        throw UsageError(
            "--issuer-max-period-usd and --issuer-max-period AMOUNT:usd both name USD");
      }
    }
  } else if (values.count("--issuer-max-period-usd") != 0) {
    throw UsageError("--issuer-max-period-usd is for --issuer-token-file, which is not given");
  } else if (!options.issuer_max_period.empty()) {
    throw UsageError("--issuer-max-period is for --issuer-token-file, which is not given");
  }
  if (values.count("--webhook-database") != 0)
    options.webhook_database = values["--webhook-database"];
  if (values.count("--upstream-timeout") != 0) {
    options.upstream_timeout_s =
        ParseInt("--upstream-timeout", values["--upstream-timeout"], 1, 600);
  }
  if (values.count("--threads") != 0) {
    options.threads = ParseInt("--threads", values["--threads"], 1, 1024);
  }
  if (values.count("--database-pool") != 0) {
    options.database_pool = ParseInt("--database-pool", values["--database-pool"], 1, 256);
  }
  // Stripe keeps a key at least 24 hours: a longer window would trust a
  // memory it may have pruned.
  if (values.count("--idempotency-window") != 0) {
    options.idempotency_window_s =
        ParseInt("--idempotency-window", values["--idempotency-window"], 1, 86400);
  }
  if (values.count("--reconcile-after") != 0) {
    options.reconcile_after_s =
        ParseInt("--reconcile-after", values["--reconcile-after"], 1, 86400);
  }
  // An attempt still waiting for Stripe's answer must not count as quiet.
  if (options.reconcile_after_s < options.upstream_timeout_s) {
    throw UsageError("--reconcile-after (" + std::to_string(options.reconcile_after_s) +
                     ") must be at least --upstream-timeout (" +
                     std::to_string(options.upstream_timeout_s) + ")");
  }
  if (values.count("--issuer-max-key-days") != 0) {
    options.issuer_max_key_days =
        ParseInt("--issuer-max-key-days", values["--issuer-max-key-days"], 1, 36500);
  }
  if (values.count("--issuer-period-months") != 0) {
    options.issuer_period_months =
        ParseInt("--issuer-period-months", values["--issuer-period-months"], 0, 1200);
  }
  if (values.count("--max-connections") != 0) {
    options.max_connections =
        ParseInt("--max-connections", values["--max-connections"], 1, 1000000);
  }
  const struct {
    const char* flag;
    int* seconds;
  } timeouts[] = {{"--header-timeout", &options.header_timeout_s},
                  {"--body-timeout", &options.body_timeout_s},
                  {"--idle-timeout", &options.idle_timeout_s}};
  for (const auto& timeout : timeouts) {
    if (values.count(timeout.flag) != 0) {
      *timeout.seconds = ParseInt(timeout.flag, values[timeout.flag], 1, 3600);
    }
  }
  return options;
}

}  // namespace billguard::proxy
