// billguard-proxy's command line.
#pragma once

#include <map>
#include <stdexcept>
#include <string>

namespace billguard::proxy {

struct Options {
  std::string listen_host;
  int listen_port = 0;  // 0: any free port, announced on stdout
  std::string database;
  std::string upstream;
  std::string upstream_key_file;
  std::string admin_token_file;
  std::string issuer_token_file;  // empty: only the admin token issues keys
  // The largest new budget (USD, e.g. 5000.00) the issuer token may create;
  // empty: none in USD unless issuer_max_period names usd.
  std::string issuer_max_period_usd;
  // --issuer-max-period AMOUNT:CURRENCY: the largest new budget the issuer
  // token may create in each currency named (lower-case ISO code -> amount
  // in its major unit). A currency named neither here nor, for USD, by
  // issuer_max_period_usd gets no new budget from the issuer token. One of
  // the two is required with issuer_token_file.
  std::map<std::string, std::string> issuer_max_period;
  std::string webhook_database;  // empty: POST /webhooks/stripe is not served
  int upstream_timeout_s = 20;
  int threads = 64;  // requests decided at once (worker threads)
  int database_pool = 8;
  // What happens to a reserved key over time, and what the issuer token
  // may ask for (ledger.hpp's LedgerPolicy).
  int idempotency_window_s = 23 * 3600;
  int reconcile_after_s = 120;
  int issuer_max_key_days = 100;
  int issuer_period_months = 1;
  int max_connections = 10000;
  int header_timeout_s = 10;
  int body_timeout_s = 10;
  int idle_timeout_s = 60;
  bool help = false;
};

// Bad flags: what is wrong, for one line on stderr before the usage.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

extern const char* const kUsage;

Options ParseCommandLine(int argc, char** argv);

}  // namespace billguard::proxy
