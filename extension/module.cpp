// Module initialisation: settings and, when preloaded, shared memory and the
// launcher, which starts the dispatchers.
#include <cstring>

#include "api_base.hpp"

#include "dispatcher_wakeup.hpp"
#include "launcher.hpp"
#include "module.hpp"
#include "shared_state.hpp"
#include "terminal_wakeups.hpp"

extern "C" {
#include "postgres.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/guc.h"

PG_MODULE_MAGIC;
void _PG_init(void);
}

namespace billguard::settings {
char* key_namespace = nullptr;
int snapshot_every = 100;
char* database = nullptr;
char* api_base = nullptr;
char* api_key_file = nullptr;
char* stripe_endpoint = nullptr;
char* stripe_version = nullptr;
int max_inflight = 16;
double max_requests_per_second = 25;
int request_timeout_ms = 30000;
int idempotency_window_s = 23 * 3600;
int max_attempts = 20;
int poll_interval_ms = 1000;
int search_settle_delay_s = 120;
char* webhook_secret_file = nullptr;
}  // namespace billguard::settings

namespace {

// The namespace is part of every key: ':' would make keys ambiguous and an
// empty one would break compatibility with the seed's "akka-billing".
bool CheckKeyNamespace(char** newval, void** /*extra*/, GucSource /*source*/) {
  if (*newval == nullptr || (*newval)[0] == '\0') {
    GUC_check_errdetail("billguard.key_namespace must not be empty.");
    return false;
  }
  if (std::strchr(*newval, ':') != nullptr) {
    GUC_check_errdetail("billguard.key_namespace must not contain ':'.");
    return false;
  }
  return true;
}

// Check hooks also run in the postmaster, where an escaping C++ exception
// would end the server: a hook that calls C++ runs its check through this.
// `check` returns why it refuses the value ("" accepts it); the reason is
// copied out so that GUC_check_errdetail runs once every C++ object is gone.
template <typename Check>
bool GuardedCheck(Check&& check, char* reason, size_t size) noexcept {
  try {
    strlcpy(reason, check().c_str(), size);
  } catch (...) {
    strlcpy(reason, "The value could not be checked.", size);
  }
  return reason[0] == '\0';
}

bool CheckApiBase(char** newval, void** /*extra*/, GucSource /*source*/) {
  const char* url = *newval != nullptr ? *newval : "";
  char reason[512];
  if (GuardedCheck([url] { return billguard::ApiBaseError(url); }, reason, sizeof(reason)))
    return true;
  GUC_check_errdetail("%s", reason);
  return false;
}

bool CheckStripeEndpoint(char** newval, void** /*extra*/, GucSource /*source*/) {
  if (*newval == nullptr || (std::strcmp(*newval, "/v1/payment_intents") != 0 &&
                             std::strcmp(*newval, "/v1/charges") != 0)) {
    GUC_check_errdetail("billguard.stripe_endpoint must be /v1/payment_intents or /v1/charges.");
    return false;
  }
  return true;
}

void DefineDispatcherSettings() {
  using namespace billguard::settings;
  DefineCustomStringVariable("billguard.database",
                             "The only database billguard serves (unset: every database).",
                             "Unset, a dispatcher runs in every database that has the extension.",
                             &database, "", PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
  DefineCustomStringVariable("billguard.api_base", "Base URL of the Stripe API (or the proxy).",
                             nullptr, &api_base, "https://api.stripe.com", PGC_SIGHUP, 0,
                             CheckApiBase, nullptr, nullptr);
  // The path is superuser-only too: it says where the secret lives.
  DefineCustomStringVariable(
      "billguard.api_key_file", "File holding the Stripe key (rk_, sk_ or a proxy vault key vk_).",
      "Read at start and on SIGHUP; the key itself is never logged or shown.", &api_key_file, "",
      PGC_SIGHUP, GUC_SUPERUSER_ONLY, nullptr, nullptr, nullptr);
  DefineCustomStringVariable("billguard.stripe_endpoint", "Stripe endpoint that creates charges.",
                             nullptr, &stripe_endpoint, "/v1/payment_intents", PGC_SIGHUP, 0,
                             CheckStripeEndpoint, nullptr, nullptr);
  DefineCustomStringVariable("billguard.stripe_version", "Pinned Stripe-Version header.", nullptr,
                             &stripe_version, "2024-06-20", PGC_SIGHUP, 0, nullptr, nullptr,
                             nullptr);
  DefineCustomIntVariable("billguard.max_inflight", "Concurrent Stripe requests.", nullptr,
                          &max_inflight, 16, 1, 1024, PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
  DefineCustomRealVariable("billguard.max_requests_per_second",
                           "Request rate limit (Stripe allows 25/s in test mode, 100/s live).",
                           nullptr, &max_requests_per_second, 25, 0.1, 100000, PGC_SIGHUP, 0,
                           nullptr, nullptr, nullptr);
  DefineCustomIntVariable("billguard.request_timeout", "Timeout of one Stripe request.", nullptr,
                          &request_timeout_ms, 30000, 100, 600000, PGC_SIGHUP, GUC_UNIT_MS, nullptr,
                          nullptr, nullptr);
  DefineCustomIntVariable(
      "billguard.idempotency_window",
      "How long after the first dispatch Stripe's idempotency cache is trusted.",
      "Older records are searched for at Stripe before being re-sent; Stripe keeps keys >= 24 h.",
      &idempotency_window_s, 23 * 3600, 1, 7 * 24 * 3600, PGC_SIGHUP, GUC_UNIT_S, nullptr, nullptr,
      nullptr);
  DefineCustomIntVariable(
      "billguard.max_attempts", "Attempts before a record with indeterminate errors needs review.",
      nullptr, &max_attempts, 20, 1, 1000, PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
  DefineCustomIntVariable("billguard.poll_interval",
                          "How often the dispatcher looks for due records without a wake-up.",
                          nullptr, &poll_interval_ms, 1000, 10, 3600000, PGC_SIGHUP, GUC_UNIT_MS,
                          nullptr, nullptr, nullptr);
  DefineCustomIntVariable("billguard.search_settle_delay",
                          "How long an unknown outcome waits before search may call it absent.",
                          nullptr, &search_settle_delay_s, 120, 0, 86400, PGC_SIGHUP, GUC_UNIT_S,
                          nullptr, nullptr, nullptr);
}

// ---- Stripe webhooks ----
// Superuser-only, like the API key file: the path says where the secret
// lives. The file is read at every delivery, so a rolled secret takes effect
// as soon as the file holds it.
void DefineWebhookSettings() {
  DefineCustomStringVariable(
      "billguard.webhook_secret_file",
      "File holding the signing secret (whsec_...) of the Stripe webhook endpoint.",
      "Read by ingest_stripe_event() at every delivery; the secret is never logged or shown.",
      &billguard::settings::webhook_secret_file, "", PGC_SIGHUP, GUC_SUPERUSER_ONLY, nullptr,
      nullptr, nullptr);
}

void DefineSettings() {
  // SUSET: a session that could change the namespace could mint a second key
  // for a billing that already has one.
  DefineCustomStringVariable(
      "billguard.key_namespace", "Namespace hashed into every idempotency key.",
      "Keys are sha256(customer_id:billing_period:namespace); changing it changes all new keys.",
      &billguard::settings::key_namespace, "akka-billing", PGC_SUSET, 0, CheckKeyNamespace, nullptr,
      nullptr);
  // Read by billguard.append_event(); billing entities rarely reach it, the
  // scheduler entity does after years of periods.
  DefineCustomIntVariable(
      "billguard.snapshot_every",
      "Save a snapshot of an entity every this many appended events (0 = never).", nullptr,
      &billguard::settings::snapshot_every, 100, 0, 1000000, PGC_SUSET, 0, nullptr, nullptr,
      nullptr);
}

}  // namespace

extern "C" void _PG_init(void) {
  if (IsBinaryUpgrade) return;
  DefineSettings();
  DefineDispatcherSettings();
  DefineWebhookSettings();
  MarkGUCPrefixReserved("billguard");
  if (!process_shared_preload_libraries_in_progress) {
    // Loaded by a session: no dispatcher runs, so its settings do nothing.
    if (billguard::settings::api_key_file[0] != '\0') {
      ereport(WARNING,
              (errmsg("billguard dispatcher settings have no effect"),
               errdetail("billguard is not in shared_preload_libraries, so no dispatcher runs."),
               errhint("Add billguard to shared_preload_libraries and restart the server.")));
    }
    return;
  }
  billguard::InstallSharedState();
  billguard::InstallTerminalWakeups();
  billguard::InstallCreateExtensionHook();
  billguard::RegisterLauncher();
}
