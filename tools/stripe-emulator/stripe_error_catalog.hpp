// Every error the emulator can answer with, shaped like Stripe's:
// {"error":{"type","code","decline_code","message","param","doc_url",...}}.
// One function per kind of error, so messages and codes live in one place.
#pragma once

#include <string>
#include <string_view>

#include "api_response.hpp"

namespace stripe_emulator {

struct StripeError {
  int http_status = 400;
  std::string type;          // invalid_request_error, card_error, api_error, ...
  std::string code;          // empty: omitted
  std::string decline_code;  // empty: omitted
  std::string message;
  std::string param;                // empty: omitted
  std::string charge;               // failed charge id on charge declines
  std::string payment_intent_json;  // rendered PaymentIntent on PaymentIntent declines
};

ApiResponse render_error(const StripeError& error);

namespace errors {

// Request validation (HTTP 400, invalid_request_error).
StripeError missing_param(std::string_view param);
StripeError unknown_param(std::string_view param);
StripeError invalid_integer(std::string_view param, std::string_view value);
StripeError invalid_boolean(std::string_view param, std::string_view value);
StripeError invalid_param(std::string_view param, std::string message);
StripeError empty_string_param(std::string_view param);
StripeError amount_too_small(std::string_view currency, long long minimum);
StripeError amount_too_large(long long maximum);
StripeError invalid_currency(std::string_view currency);
StripeError malformed_parameters();
StripeError invalid_search_query(std::string message);
// application_fee_amount on a request made for the platform itself.
StripeError application_fee_without_account(bool payment_intent);

// Lookups (HTTP 404 unless the missing object is a parameter, then 400).
StripeError no_such_object(std::string_view object_name, std::string_view id,
                           std::string_view param, int http_status);
StripeError unrecognized_url(std::string_view method, std::string_view path);

// Authentication (HTTP 401). The key is masked: it must never be echoed whole.
StripeError missing_api_key();
StripeError invalid_api_key(std::string_view presented_key);
StripeError unsupported_authorization_scheme();
// A Stripe-Account header naming no account the key may act on (HTTP 403,
// what Stripe's clients raise as a PermissionError).
StripeError account_inaccessible(std::string_view presented_key, std::string_view account);

// Idempotency layer.
StripeError invalid_idempotency_key();
StripeError idempotency_mismatch(std::string_view key, std::string_view detail);
StripeError idempotency_key_in_use(std::string_view key);

// Infrastructure.
StripeError plain_request_error(int http_status,
                                std::string message);  // HTTP or control API misuse
StripeError rate_limited();
StripeError api_error(int http_status);  // 500 and other injected statuses

// Card declines (HTTP 402, card_error); callers attach the object involved.
StripeError card_declined(std::string_view code, std::string_view decline_code,
                          std::string_view message, std::string_view param);

}  // namespace errors

// "sk_test_****abcd": enough to recognise a key, never enough to use it.
std::string mask_api_key(std::string_view key);

}  // namespace stripe_emulator
