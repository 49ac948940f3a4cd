// What each /v1 endpoint does once a request has passed the rate limiter,
// authentication and the idempotency layer (see stripe_api.hpp).
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "api_response.hpp"
#include "creation_params.hpp"
#include "form_decoding.hpp"
#include "object_ledger.hpp"

namespace stripe_emulator {

struct Creation {
  ApiResponse response;
  StripeObject object;  // as recorded in the ledger
};

// Creates the PaymentIntent or Charge and records it in the ledger, declined
// or not (Stripe creates the object either way). Declining test payment
// methods answer 402 card_error.
Creation create_object(Ledger& ledger, const CreationRequest& request,
                       const std::optional<std::string>& idempotency_key);

// Reads see the objects of one account only: `account` is the request's
// Stripe-Account, nullopt for the platform's own.
ApiResponse retrieve_object(const Ledger& ledger, ObjectKind kind, const std::string& id,
                            const std::optional<std::string>& account);

// GET /v1/{payment_intents,charges}?customer=&limit=&starting_after=
// Immediately consistent, newest first.
ApiResponse list_objects(const Ledger& ledger, ObjectKind kind, const FormParams& query,
                         const std::optional<std::string>& account);

// GET /v1/{payment_intents,charges}/search?query=&limit=&page=
// Eventually consistent: objects younger than `search_delay` are not found.
ApiResponse search_objects(const Ledger& ledger, ObjectKind kind, const FormParams& query,
                           const std::optional<std::string>& account,
                           std::chrono::milliseconds search_delay);

}  // namespace stripe_emulator
