#include "stripe_error_catalog.hpp"

#include "json.hpp"

namespace stripe_emulator {

namespace {

StripeError invalid_request(std::string message, std::string_view param = {},
                            std::string_view code = {}) {
  StripeError error;
  error.http_status = 400;
  error.type = "invalid_request_error";
  error.code = std::string(code);
  error.message = std::move(message);
  error.param = std::string(param);
  return error;
}

std::string quoted(std::string_view text) {
  return "'" + std::string(text) + "'";
}

// Stripe links each error code to a page whose slug is the code with dashes.
std::string doc_url_for(std::string_view code) {
  std::string slug(code);
  for (auto& c : slug) {
    if (c == '_') c = '-';
  }
  return "https://stripe.com/docs/error-codes/" + slug;
}

}  // namespace

ApiResponse render_error(const StripeError& error) {
  JsonWriter json;
  json.begin_object().key("error").begin_object();
  if (!error.charge.empty()) json.key("charge").string(error.charge);
  if (!error.code.empty()) json.key("code").string(error.code);
  if (!error.decline_code.empty()) json.key("decline_code").string(error.decline_code);
  if (!error.code.empty()) json.key("doc_url").string(doc_url_for(error.code));
  json.key("message").string(error.message);
  if (!error.param.empty()) json.key("param").string(error.param);
  if (!error.payment_intent_json.empty()) json.key("payment_intent").raw(error.payment_intent_json);
  json.key("type").string(error.type);
  json.end_object().end_object();
  return ApiResponse{error.http_status, json.take()};
}

namespace errors {

StripeError missing_param(std::string_view param) {
  return invalid_request("Missing required param: " + std::string(param) + ".", param,
                         "parameter_missing");
}

StripeError unknown_param(std::string_view param) {
  return invalid_request("Received unknown parameter: " + std::string(param), param,
                         "parameter_unknown");
}

StripeError invalid_integer(std::string_view param, std::string_view value) {
  return invalid_request("Invalid integer: " + std::string(value), param,
                         "parameter_invalid_integer");
}

StripeError invalid_boolean(std::string_view param, std::string_view value) {
  return invalid_request("Invalid boolean: " + std::string(value), param);
}

StripeError invalid_param(std::string_view param, std::string message) {
  return invalid_request(std::move(message), param);
}

StripeError empty_string_param(std::string_view param) {
  return invalid_request("You passed an empty string for '" + std::string(param) +
                             "'. We assume empty values are an attempt to unset a parameter; "
                             "however '" +
                             std::string(param) + "' cannot be unset.",
                         param, "parameter_invalid_empty");
}

StripeError amount_too_small(std::string_view currency, long long minimum) {
  std::string message;
  if (currency == "usd") {
    message = "Amount must be at least $0.50 usd";
  } else {
    message = "Amount must be at least " + std::to_string(minimum) + " (in the smallest unit) " +
              std::string(currency);
  }
  return invalid_request(std::move(message), "amount", "amount_too_small");
}

StripeError amount_too_large(long long maximum) {
  return invalid_request(
      "Amount must be no more than " + std::to_string(maximum) + " (in the smallest currency unit)",
      "amount", "amount_too_large");
}

StripeError invalid_currency(std::string_view currency) {
  return invalid_request("Invalid currency: " + std::string(currency) +
                             ". Stripe currencies are three-letter lower-case ISO codes.",
                         "currency");
}

StripeError malformed_parameters() {
  return invalid_request(
      "Invalid request: the parameters could not be decoded as "
      "application/x-www-form-urlencoded (malformed percent escape).");
}

StripeError invalid_search_query(std::string message) {
  return invalid_request(std::move(message), "query");
}

StripeError application_fee_without_account(bool payment_intent) {
  return invalid_request(
      payment_intent
          ? "Can only apply an application_fee_amount when the PaymentIntent is attempting a "
            "direct payment (using an OAuth key or Stripe-Account header) or destination payment "
            "(using `transfer_data[destination]`)."
          : "Can only apply an application_fee_amount when the request is made on behalf of "
            "another account (using an OAuth key, the Stripe-Account header, or the destination "
            "parameter).",
      "application_fee_amount");
}

StripeError no_such_object(std::string_view object_name, std::string_view id,
                           std::string_view param, int http_status) {
  StripeError error = invalid_request("No such " + std::string(object_name) + ": " + quoted(id),
                                      param, "resource_missing");
  error.http_status = http_status;
  return error;
}

StripeError unrecognized_url(std::string_view method, std::string_view path) {
  StripeError error = invalid_request("Unrecognized request URL (" + std::string(method) + ": " +
                                      std::string(path) +
                                      "). Please see https://stripe.com/docs or we can help at "
                                      "https://support.stripe.com/.");
  error.http_status = 404;
  return error;
}

StripeError missing_api_key() {
  StripeError error = invalid_request(
      "You did not provide an API key. You need to provide your API key in the Authorization "
      "header, using Bearer auth (e.g. 'Authorization: Bearer YOUR_SECRET_KEY').");
  error.http_status = 401;
  return error;
}

StripeError invalid_api_key(std::string_view presented_key) {
  StripeError error = invalid_request("Invalid API Key provided: " + mask_api_key(presented_key));
  error.http_status = 401;
  return error;
}

StripeError account_inaccessible(std::string_view presented_key, std::string_view account) {
  StripeError error = invalid_request("The provided key " + quoted(mask_api_key(presented_key)) +
                                      " does not have access to account " + quoted(account) +
                                      " (or that account does not exist). Application access may "
                                      "have been revoked.");
  error.http_status = 403;
  return error;
}

StripeError unsupported_authorization_scheme() {
  StripeError error = invalid_request(
      "This emulator only accepts Bearer auth (e.g. 'Authorization: Bearer YOUR_SECRET_KEY').");
  error.http_status = 401;
  return error;
}

StripeError invalid_idempotency_key() {
  return invalid_request("Invalid Idempotency-Key: it must be between 1 and 255 characters long.");
}

StripeError idempotency_mismatch(std::string_view key, std::string_view detail) {
  StripeError error;
  error.http_status = 400;
  error.type = "idempotency_error";
  error.message =
      "Keys for idempotent requests can only be used with the same parameters they were first "
      "used with. " +
      std::string(detail) + "Try using a key other than " + quoted(key) +
      " if you meant to execute a different request.";
  return error;
}

StripeError idempotency_key_in_use(std::string_view key) {
  StripeError error;
  error.http_status = 409;
  error.type = "idempotency_error";
  error.code = "idempotency_key_in_use";
  error.message = "There is currently another in-progress request using this Idempotent Key " +
                  quoted(key) +
                  " (that probably means you submitted twice, and the other request is still "
                  "going through). Please retry this request later.";
  return error;
}

StripeError plain_request_error(int http_status, std::string message) {
  StripeError error = invalid_request(std::move(message));
  error.http_status = http_status;
  return error;
}

StripeError rate_limited() {
  StripeError error;
  error.http_status = 429;
  error.type = "rate_limit_error";
  error.code = "rate_limit";
  error.message =
      "Too many requests hit the API too quickly. We recommend an exponential backoff of your "
      "requests.";
  return error;
}

StripeError api_error(int http_status) {
  StripeError error;
  error.http_status = http_status;
  error.type = "api_error";
  error.message = "An unknown error occurred";
  return error;
}

StripeError card_declined(std::string_view code, std::string_view decline_code,
                          std::string_view message, std::string_view param) {
  StripeError error;
  error.http_status = 402;
  error.type = "card_error";
  error.code = std::string(code);
  error.decline_code = std::string(decline_code);
  error.message = std::string(message);
  error.param = std::string(param);
  return error;
}

}  // namespace errors

std::string mask_api_key(std::string_view key) {
  if (key.size() >= 16) {
    return std::string(key.substr(0, 8)) + "****" + std::string(key.substr(key.size() - 4));
  }
  // Too short for prefix + suffix without revealing most of it.
  return std::string(key.substr(0, key.size() / 4)) + "****";
}

}  // namespace stripe_emulator
