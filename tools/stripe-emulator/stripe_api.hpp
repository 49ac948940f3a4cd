// The /v1 API, in the order Stripe processes a request:
//   rate limiter -> authentication (and Stripe-Account) -> routing -> injected faults ->
//   idempotency layer (replay / conflict / in use) -> latency ->
//   parameter validation -> endpoint execution -> save response for the key.
#pragma once

#include <optional>
#include <string>

#include "emulator_state.hpp"
#include "form_decoding.hpp"
#include "http_exchange.hpp"
#include "stripe_error_catalog.hpp"

namespace stripe_emulator {

class StripeApi {
 public:
  explicit StripeApi(EmulatorState& state) : state_(state) {}

  HandlerResult handle(const HttpRequest& request);

 private:
  enum class Operation { create, retrieve, list, search };
  struct Route {
    Operation operation;
    ObjectKind kind;
    std::string object_id;  // for retrieve
  };

  static std::optional<Route> resolve_route(const std::string& method, const std::string& path);
  std::optional<StripeError> authenticate(const HttpRequest& request, std::string& api_key) const;
  // The connected account of Stripe-Account (nullopt without the header:
  // the platform), or a 403 for a value that names no account or one that
  // refuses the platform.
  std::optional<StripeError> connected_account(const HttpRequest& request,
                                               const std::string& api_key,
                                               std::optional<std::string>& account) const;
  HandlerResult run_creation(const HttpRequest& request, const Route& route,
                             const std::string& api_key, const std::optional<std::string>& account,
                             const FormParams& params, const std::optional<Fault>& server_error);
  HandlerResult run_read(const Route& route, const std::optional<std::string>& account,
                         const FormParams& params);
  void sleep_for_configured_latency() const;

  EmulatorState& state_;
};

}  // namespace stripe_emulator
