#include "stripe_endpoints.hpp"

#include <ctime>
#include <string_view>

#include "random_ids.hpp"
#include "search_query.hpp"
#include "stripe_error_catalog.hpp"

namespace stripe_emulator {

namespace {

// Stripe's test payment methods and tokens that do not simply succeed.
struct TestDecline {
  std::string_view payment_source;
  std::string_view code;
  std::string_view decline_code;
  std::string_view message;
  bool authentication_required;  // declines only off session; on session it asks for 3DS
};

constexpr TestDecline kTestDeclines[] = {
    {"pm_card_chargeDeclined", "card_declined", "generic_decline", "Your card was declined.",
     false},
    {"pm_card_chargeDeclinedInsufficientFunds", "card_declined", "insufficient_funds",
     "Your card has insufficient funds.", false},
    {"pm_card_authenticationRequired", "authentication_required", "authentication_required",
     "Your card was declined. This transaction requires authentication.", true},
    {"tok_chargeDeclined", "card_declined", "generic_decline", "Your card was declined.", false},
    {"tok_chargeDeclinedInsufficientFunds", "card_declined", "insufficient_funds",
     "Your card has insufficient funds.", false},
};

const TestDecline* find_test_decline(const std::optional<std::string>& payment_source) {
  if (!payment_source) return nullptr;
  for (const auto& decline : kTestDeclines) {
    if (decline.payment_source == *payment_source) return &decline;
  }
  return nullptr;
}

const char* collection_path(ObjectKind kind) {
  return kind == ObjectKind::payment_intent ? "/v1/payment_intents" : "/v1/charges";
}

StripeObject new_object(const CreationRequest& request,
                        const std::optional<std::string>& idempotency_key) {
  StripeObject object;
  object.kind = request.kind;
  object.id = new_object_id(request.kind == ObjectKind::payment_intent ? "pi" : "ch");
  object.account = request.account;
  object.application_fee_amount = request.application_fee_amount;
  object.amount = request.amount;
  object.currency = request.currency;
  object.customer = request.customer;
  object.payment_source = request.payment_source;
  object.description = request.description;
  object.metadata = request.metadata;
  object.automatic_payment_methods = request.automatic_payment_methods;
  object.allow_redirects = request.allow_redirects;
  object.payment_method_types = request.payment_method_types;
  object.created_unix = static_cast<std::int64_t>(std::time(nullptr));
  object.created_at = std::chrono::steady_clock::now();
  object.idempotency_key = idempotency_key;
  return object;
}

Creation create_payment_intent(Ledger& ledger, const CreationRequest& request,
                               const std::optional<std::string>& idempotency_key) {
  StripeObject intent = new_object(request, idempotency_key);
  const TestDecline* decline =
      request.confirm ? find_test_decline(request.payment_source) : nullptr;
  if (!request.confirm) {
    intent.status = "requires_confirmation";
  } else if (decline && decline->authentication_required && !request.off_session) {
    intent.status = "requires_action";  // the customer is present and can authenticate
  } else if (decline) {
    intent.status = "requires_payment_method";
    intent.failure_code = std::string(decline->code);
    intent.failure_message = std::string(decline->message);
    intent.decline_code = std::string(decline->decline_code);
    StripeError error =
        errors::card_declined(decline->code, decline->decline_code, decline->message, "");
    error.payment_intent_json = render_api_object(intent);
    ledger.record(intent);
    return {render_error(error), intent};
  } else {
    intent.status = "succeeded";
    intent.latest_charge = new_object_id("ch");
  }
  ApiResponse response{200, render_api_object(intent)};
  ledger.record(intent);
  return {response, intent};
}

Creation create_charge(Ledger& ledger, const CreationRequest& request,
                       const std::optional<std::string>& idempotency_key) {
  StripeObject charge = new_object(request, idempotency_key);
  if (const TestDecline* decline = find_test_decline(request.payment_source)) {
    charge.status = "failed";
    charge.failure_code = std::string(decline->code);
    charge.failure_message = std::string(decline->message);
    StripeError error =
        errors::card_declined(decline->code, decline->decline_code, decline->message, "");
    error.charge = charge.id;
    ledger.record(charge);
    return {render_error(error), charge};
  }
  charge.status = "succeeded";
  ApiResponse response{200, render_api_object(charge)};
  ledger.record(charge);
  return {response, charge};
}

std::optional<StripeError> parse_limit(const std::string& text, std::size_t& limit) {
  if (text.empty() || text.size() > 9 ||
      text.find_first_not_of("0123456789") != std::string::npos) {
    return errors::invalid_integer("limit", text);
  }
  const long value = std::stol(text);
  if (value < 1 || value > 100) {
    return errors::invalid_param(
        "limit", "This value must be greater than or equal to 1 and less than or equal to 100.");
  }
  limit = static_cast<std::size_t>(value);
  return std::nullopt;
}

std::string render_collection(const char* object_type, const LedgerPage& page,
                              const std::string& url, const std::optional<std::string>& next_page,
                              bool with_next_page) {
  JsonWriter json;
  json.begin_object().key("object").string(object_type).key("data").begin_array();
  for (const auto& object : page.items) write_api_object(json, object);
  json.end_array().key("has_more").boolean(page.has_more);
  if (with_next_page) json.key("next_page").optional_string(next_page);
  json.key("url").string(url).end_object();
  return json.take();
}

// Search pages are continued with an opaque token; here it encodes an offset.
constexpr std::string_view kPageTokenPrefix = "emulator_page_";

}  // namespace

Creation create_object(Ledger& ledger, const CreationRequest& request,
                       const std::optional<std::string>& idempotency_key) {
  return request.kind == ObjectKind::payment_intent
             ? create_payment_intent(ledger, request, idempotency_key)
             : create_charge(ledger, request, idempotency_key);
}

ApiResponse retrieve_object(const Ledger& ledger, ObjectKind kind, const std::string& id,
                            const std::optional<std::string>& account) {
  // Another account's object is as missing as one that never existed.
  const auto object = ledger.find(kind, id, account);
  if (!object) {
    const bool intent = kind == ObjectKind::payment_intent;
    return render_error(errors::no_such_object(intent ? "payment_intent" : "charge", id,
                                               intent ? "intent" : "id", 404));
  }
  return ApiResponse{200, render_api_object(*object)};
}

ApiResponse list_objects(const Ledger& ledger, ObjectKind kind, const FormParams& query,
                         const std::optional<std::string>& account) {
  LedgerQuery ledger_query;
  ledger_query.kind = kind;
  ledger_query.account = account;
  std::optional<std::string> customer;
  for (const auto& [name, value] : query) {
    if (name == "customer") {
      customer = value;
    } else if (name == "limit") {
      if (auto error = parse_limit(value, ledger_query.limit)) return render_error(*error);
    } else if (name == "starting_after") {
      ledger_query.starting_after = value;
    } else {
      return render_error(errors::unknown_param(name));
    }
  }
  if (customer) {
    ledger_query.matches = [customer](const StripeObject& object) {
      return object.customer == customer;
    };
  }
  const LedgerPage page = ledger.query(ledger_query);
  if (!page.cursor_found) {
    return render_error(errors::no_such_object(object_type_name(kind), ledger_query.starting_after,
                                               "starting_after", 400));
  }
  return ApiResponse{200,
                     render_collection("list", page, collection_path(kind), std::nullopt, false)};
}

ApiResponse search_objects(const Ledger& ledger, ObjectKind kind, const FormParams& query,
                           const std::optional<std::string>& account,
                           std::chrono::milliseconds search_delay) {
  LedgerQuery ledger_query;
  ledger_query.kind = kind;
  ledger_query.account = account;
  std::optional<std::string> query_text;
  for (const auto& [name, value] : query) {
    if (name == "query") {
      query_text = value;
    } else if (name == "limit") {
      if (auto error = parse_limit(value, ledger_query.limit)) return render_error(*error);
    } else if (name == "page") {
      const std::string offset = value.compare(0, kPageTokenPrefix.size(), kPageTokenPrefix) == 0
                                     ? value.substr(kPageTokenPrefix.size())
                                     : std::string();
      if (offset.empty() || offset.size() > 9 ||
          offset.find_first_not_of("0123456789") != std::string::npos) {
        return render_error(errors::invalid_param("page", "Invalid page token: " + value));
      }
      ledger_query.skip = std::stoul(offset);
    } else {
      return render_error(errors::unknown_param(name));
    }
  }
  if (!query_text) return render_error(errors::missing_param("query"));
  std::string problem;
  auto clauses = parse_search_query(*query_text, problem);
  if (!clauses) return render_error(errors::invalid_search_query(problem));

  ledger_query.matches = [clauses = std::move(*clauses)](const StripeObject& object) {
    return matches_all(clauses, object);
  };
  ledger_query.created_no_later_than = std::chrono::steady_clock::now() - search_delay;
  const LedgerPage page = ledger.query(ledger_query);
  std::optional<std::string> next_page;
  if (page.has_more) {
    next_page =
        std::string(kPageTokenPrefix) + std::to_string(ledger_query.skip + page.items.size());
  }
  const std::string url = std::string(collection_path(kind)) + "/search";
  return ApiResponse{200, render_collection("search_result", page, url, next_page, true)};
}

}  // namespace stripe_emulator
