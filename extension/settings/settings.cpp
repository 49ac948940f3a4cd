// billguard's settings (see settings.hpp): their variables, defaults, checks
// and definitions.
#include <cstring>

#include "common/api_base.hpp"

#include "postgres/pg_compat.hpp"
#include "settings/settings.hpp"

extern "C" {
#include "postgres.h"
#include "utils/datetime.h"
#include "utils/guc.h"
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
int max_unknown_cycles = 5;
int poll_interval_ms = 1000;
int search_settle_delay_s = 120;
char* vault_issuer_token_file = nullptr;
double vault_cap_headroom = 1.10;
int auto_bill = kAutoBillOff;
int bill_day = 1;
int bill_hour_utc = 0;
char* scheduler_now = nullptr;
char* webhook_secret_file = nullptr;
}  // namespace billguard::settings

namespace {

// How long Stripe promises to remember an idempotency key.
constexpr int kStripeKeyLifetimeSeconds = 24 * 3600;

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
  // At most what Stripe promises: it may prune a key once it is 24 hours
  // old, and a record trusted longer would be re-sent as a new charge. A
  // postgresql.conf asking for more is refused at start (the server starts
  // with the default and logs a WARNING) and at reload (the value in force
  // stays, and pg_file_settings says why).
  DefineCustomIntVariable(
      "billguard.idempotency_window",
      "How long after the first dispatch Stripe's idempotency cache is trusted (at most 24 h).",
      "Older records are searched for at Stripe before being re-sent; Stripe keeps keys >= 24 h.",
      &idempotency_window_s, 23 * 3600, 1, kStripeKeyLifetimeSeconds, PGC_SIGHUP, GUC_UNIT_S,
      nullptr, nullptr, nullptr);
  DefineCustomIntVariable(
      "billguard.max_attempts", "Attempts before a record with indeterminate errors needs review.",
      nullptr, &max_attempts, 20, 1, 1000, PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
  DefineCustomIntVariable(
      "billguard.max_unknown_cycles",
      "Indeterminate answers, each followed by a search that found nothing, before a record needs "
      "review.",
      "A 500 that created nothing is replayed by Stripe for the key: re-sending cannot settle it.",
      &max_unknown_cycles, 5, 1, 1000, PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
  DefineCustomIntVariable("billguard.poll_interval",
                          "How often the dispatcher looks for due records without a wake-up.",
                          nullptr, &poll_interval_ms, 1000, 10, 3600000, PGC_SIGHUP, GUC_UNIT_MS,
                          nullptr, nullptr, nullptr);
  DefineCustomIntVariable("billguard.search_settle_delay",
                          "How long an unknown outcome waits before search may call it absent.",
                          nullptr, &search_settle_delay_s, 120, 0, 86400, PGC_SIGHUP, GUC_UNIT_S,
                          nullptr, nullptr, nullptr);
  // Superuser-only like api_key_file: the path says where the secret lives.
  DefineCustomStringVariable(
      "billguard.vault_issuer_token_file",
      "File holding billguard-proxy's issuer token: set, each period is billed with a vault key.",
      "The dispatcher obtains each period's vault key from the proxy at billguard.api_base; "
      "the token itself is never logged or shown.",
      &vault_issuer_token_file, "", PGC_SIGHUP, GUC_SUPERUSER_ONLY, nullptr, nullptr, nullptr);
  DefineCustomRealVariable(
      "billguard.vault_cap_headroom", "A period's vault cap: its claimed total times this.",
      nullptr, &vault_cap_headroom, 1.10, 1.0, 10.0, PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
}

// An instant, as timestamptz reads it (with its zone, e.g.
// '2026-09-01 00:00:00+00'), or "". A value that moves ('now', 'today',
// 'epoch' and the like) is refused: the point is a clock that stands still.
// ParseDateTime and DecodeDateTime report errors by their result, never by
// ereport, so this runs safely in the postmaster too.
bool CheckSchedulerNow(char** newval, void** /*extra*/, GucSource /*source*/) {
  const char* value = *newval != nullptr ? *newval : "";
  if (value[0] == '\0') return true;
  char buffer[MAXDATELEN + MAXDATEFIELDS];
  char* fields[MAXDATEFIELDS];
  int types[MAXDATEFIELDS];
  int count = 0;
  int kind = 0;
  pg_tm tm;
  fsec_t fraction = 0;
  int zone = 0;
  Timestamp instant = 0;
  const bool valid =
      value[0] >= '0' && value[0] <= '9' && strlen(value) < MAXDATELEN &&
      ParseDateTime(value, buffer, sizeof(buffer), fields, types, MAXDATEFIELDS, &count) == 0 &&
      billguard::compat::DecodeDateTime(fields, types, count, &kind, &tm, &fraction, &zone) == 0 &&
      kind == DTK_DATE && tm2timestamp(&tm, fraction, &zone, &instant) == 0;
  if (!valid) {
    GUC_check_errdetail(
        "billguard.scheduler_now must be empty or an instant such as '2026-09-01 00:00:00+00'.");
  }
  return valid;
}

// The scheduler bills each period once, from the calendar alone (see
// scheduler.cpp and sql/install/57_scheduler.sql).
void DefineSchedulerSettings() {
  using namespace billguard::settings;
  static const config_enum_entry kAutoBillOptions[] = {
      {"off", kAutoBillOff, false}, {"monthly", kAutoBillMonthly, false}, {nullptr, 0, false}};
  DefineCustomEnumVariable(
      "billguard.auto_bill", "Whether the dispatcher bills each period by itself: off or monthly.",
      "monthly: once the UTC calendar passes bill_day at bill_hour_utc, the previous calendar "
      "month is billed with bill_period.",
      &auto_bill, kAutoBillOff, kAutoBillOptions, PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
  DefineCustomIntVariable("billguard.bill_day",
                          "Day of the month (UTC) on which the previous month is billed.", nullptr,
                          &bill_day, 1, 1, 28, PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
  DefineCustomIntVariable("billguard.bill_hour_utc",
                          "Hour (UTC) of bill_day at which the previous month is billed.", nullptr,
                          &bill_hour_utc, 0, 0, 23, PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
  // SUSET: only a superuser may make the scheduler believe it is another day.
  DefineCustomStringVariable("billguard.scheduler_now",
                             "For tests only: the instant the scheduler takes for now.",
                             "Unset (the default), the scheduler reads the clock.", &scheduler_now,
                             "", PGC_SUSET, 0, CheckSchedulerNow, nullptr, nullptr);
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

void DefineGeneralSettings() {
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

namespace billguard {

void DefineSettings() {
  DefineGeneralSettings();
  DefineDispatcherSettings();
  DefineSchedulerSettings();
  DefineWebhookSettings();
  MarkGUCPrefixReserved("billguard");
}

}  // namespace billguard
