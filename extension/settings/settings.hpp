// The extension's settings (GUCs, billguard.*): the variables every part
// reads, defined with their defaults and checks in settings.cpp.
#pragma once

namespace billguard::settings {

// billguard.key_namespace: the third field of every idempotency key.
extern char* key_namespace;
// billguard.snapshot_every: append_event() snapshots every N events.
extern int snapshot_every;

// The dispatcher's settings; see settings.cpp for their meaning and defaults.
extern char* database;
extern char* api_base;
extern char* api_key_file;
extern char* stripe_endpoint;
extern char* stripe_version;
extern int max_inflight;
extern double max_requests_per_second;
extern int request_timeout_ms;
extern int idempotency_window_s;
extern int max_attempts;
extern int max_unknown_cycles;
extern int poll_interval_ms;
extern int search_settle_delay_s;
// Billing through billguard-proxy: the issuer token's file ("" bills with
// api_key_file), and the headroom of each period's cap over its total.
extern char* vault_issuer_token_file;
extern double vault_cap_headroom;

// The scheduler's settings (settings.cpp; read by scheduler.cpp and
// scheduler_settings.cpp).
enum AutoBill { kAutoBillOff = 0, kAutoBillMonthly = 1 };
extern int auto_bill;
extern int bill_day;
extern int bill_hour_utc;
extern char* scheduler_now;  // test-only: "" is the clock

// ---- Stripe webhooks ----
// billguard.webhook_secret_file: the webhook endpoint's signing secret
// (whsec_...), read by ingest_stripe_event() at every delivery.
extern char* webhook_secret_file;

}  // namespace billguard::settings

namespace billguard {

// Defines every billguard.* setting and reserves the prefix; _PG_init's
// first step, in every process that loads the library.
void DefineSettings();

}  // namespace billguard
