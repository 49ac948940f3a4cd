#include "creation_params.hpp"

#include <map>
#include <set>

namespace stripe_emulator {

namespace {

// Stripe's documented limits.
constexpr std::int64_t kMaxAmount = 99999999;
constexpr std::size_t kMaxMetadataKeys = 50;
constexpr std::size_t kMaxMetadataKeyLength = 40;
constexpr std::size_t kMaxMetadataValueLength = 500;

// Minimum charge amounts in the smallest unit for common currencies; others: 1.
std::int64_t minimum_amount(const std::string& currency) {
  static const std::map<std::string, std::int64_t> kMinimums = {
      {"usd", 50}, {"eur", 50}, {"gbp", 30}, {"cad", 50}, {"aud", 50},
      {"chf", 50}, {"jpy", 50}, {"nzd", 50}, {"sgd", 50}, {"sek", 300},
  };
  const auto found = kMinimums.find(currency);
  return found == kMinimums.end() ? 1 : found->second;
}

const std::set<std::string>& allowed_scalar_params(ObjectKind kind) {
  static const std::set<std::string> kPaymentIntent = {
      "amount",
      "currency",
      "customer",
      "payment_method",
      "confirm",
      "off_session",
      "description",
      "application_fee_amount",
      "return_url",
      "automatic_payment_methods[enabled]",
      "automatic_payment_methods[allow_redirects]"};
  static const std::set<std::string> kCharge = {"amount", "currency",    "customer",
                                                "source", "description", "application_fee_amount"};
  return kind == ObjectKind::payment_intent ? kPaymentIntent : kCharge;
}

// Stripe counts characters, not bytes: count UTF-8 lead bytes.
std::size_t character_count(const std::string& text) {
  std::size_t count = 0;
  for (const char c : text) {
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) ++count;
  }
  return count;
}

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

bool starts_with_any(const std::string& text, std::initializer_list<const char*> prefixes) {
  for (const char* prefix : prefixes) {
    if (starts_with(text, prefix)) return true;
  }
  return false;
}

std::optional<std::int64_t> parse_non_negative_integer(const std::string& text) {
  if (text.empty() || text.size() > 18 ||
      text.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  return std::stoll(text);
}

// The scalar parameters by name (the last value wins, as in Stripe) and the
// metadata hash, or the first error found while sorting them out.
struct SortedParams {
  std::map<std::string, std::string> scalars;
  Metadata metadata;
  std::vector<std::string> payment_method_types;  // payment_method_types[] or [N]
};

bool is_array_element(const std::string& name, const std::string& array) {
  if (!starts_with(name, array + "[") || name.back() != ']') return false;
  const std::string index = name.substr(array.size() + 1, name.size() - array.size() - 2);
  return index.find_first_not_of("0123456789") == std::string::npos;
}

std::optional<StripeError> sort_params(ObjectKind kind, const FormParams& params,
                                       SortedParams& sorted) {
  const auto& allowed = allowed_scalar_params(kind);
  for (const auto& [name, value] : params) {
    if (starts_with(name, "metadata[") && name.back() == ']') {
      const std::string key = name.substr(9, name.size() - 10);
      if (key.empty() || key.find_first_of("[]") != std::string::npos) {
        return errors::invalid_param(
            "metadata", "Invalid metadata key: " + key + ". Metadata is a flat hash of strings.");
      }
      // An empty value unsets the key, as on Stripe.
      if (value.empty()) {
        sorted.metadata.erase(key);
      } else {
        sorted.metadata[key] = value;
      }
    } else if (name == "metadata") {
      if (!value.empty()) {
        return errors::invalid_param("metadata",
                                     "Invalid hash: metadata must be sent as metadata[key]=value.");
      }
      sorted.metadata.clear();
    } else if (kind == ObjectKind::payment_intent &&
               is_array_element(name, "payment_method_types")) {
      sorted.payment_method_types.push_back(value);
    } else if (allowed.count(name)) {
      sorted.scalars[name] = value;
    } else {
      return errors::unknown_param(name);
    }
  }
  return std::nullopt;
}

std::optional<StripeError> check_metadata(const Metadata& metadata) {
  if (metadata.size() > kMaxMetadataKeys) {
    return errors::invalid_param(
        "metadata", "Invalid metadata: metadata can have up to 50 keys, but you passed in " +
                        std::to_string(metadata.size()) + " keys.");
  }
  for (const auto& [key, value] : metadata) {
    if (character_count(key) > kMaxMetadataKeyLength) {
      return errors::invalid_param(
          "metadata", "Invalid metadata: metadata keys can have up to 40 characters, but " + key +
                          " has " + std::to_string(character_count(key)) + ".");
    }
    if (character_count(value) > kMaxMetadataValueLength) {
      return errors::invalid_param(
          "metadata",
          "Invalid metadata: metadata values can have up to 500 characters, "
          "but you passed in a value that is " +
              std::to_string(character_count(value)) + " characters long (key " + key + ").");
    }
  }
  return std::nullopt;
}

std::optional<StripeError> read_boolean(const std::map<std::string, std::string>& scalars,
                                        const std::string& name, bool& flag) {
  const auto found = scalars.find(name);
  if (found == scalars.end()) return std::nullopt;
  if (found->second == "true") {
    flag = true;
  } else if (found->second == "false") {
    flag = false;
  } else {
    return errors::invalid_boolean(name, found->second);
  }
  return std::nullopt;
}

std::optional<StripeError> read_amount_and_currency(
    const std::map<std::string, std::string>& scalars, CreationRequest& request) {
  for (const char* required : {"amount", "currency"}) {
    const auto found = scalars.find(required);
    if (found == scalars.end()) return errors::missing_param(required);
    if (found->second.empty()) return errors::empty_string_param(required);
  }
  const std::string& amount_text = scalars.at("amount");
  const auto amount = parse_non_negative_integer(amount_text);
  if (!amount) return errors::invalid_integer("amount", amount_text);

  request.currency = scalars.at("currency");
  const bool iso_shaped =
      request.currency.size() == 3 &&
      request.currency.find_first_not_of("abcdefghijklmnopqrstuvwxyz") == std::string::npos;
  if (!iso_shaped) return errors::invalid_currency(request.currency);

  const std::int64_t minimum = minimum_amount(request.currency);
  if (*amount < minimum) return errors::amount_too_small(request.currency, minimum);
  if (*amount > kMaxAmount) return errors::amount_too_large(kMaxAmount);
  request.amount = *amount;
  return std::nullopt;
}

// A direct charge on a connected account may move part of it to the
// platform; a request for the platform itself has no one to take it from.
std::optional<StripeError> read_application_fee(const std::map<std::string, std::string>& scalars,
                                                bool on_connected_account,
                                                CreationRequest& request) {
  const auto found = scalars.find("application_fee_amount");
  if (found == scalars.end()) return std::nullopt;
  if (found->second.empty()) return errors::empty_string_param("application_fee_amount");
  const auto fee = parse_non_negative_integer(found->second);
  if (!fee) return errors::invalid_integer("application_fee_amount", found->second);
  if (!on_connected_account) {
    return errors::application_fee_without_account(request.kind == ObjectKind::payment_intent);
  }
  if (*fee > request.amount) {
    return errors::invalid_param("application_fee_amount",
                                 "The application fee (" + found->second +
                                     ") cannot be greater than the amount of the charge (" +
                                     std::to_string(request.amount) + ").");
  }
  request.application_fee_amount = *fee;
  return std::nullopt;
}

std::optional<StripeError> read_customer_and_source(
    const std::map<std::string, std::string>& scalars, CreationRequest& request) {
  const bool is_intent = request.kind == ObjectKind::payment_intent;
  const char* source_param = is_intent ? "payment_method" : "source";
  if (const auto found = scalars.find(source_param);
      found != scalars.end() && !found->second.empty()) {
    const bool known_shape = is_intent ? starts_with_any(found->second, {"pm_", "card_", "src_"})
                                       : starts_with_any(found->second, {"tok_", "card_", "src_"});
    if (!known_shape) {
      return errors::no_such_object(is_intent ? "PaymentMethod" : "token", found->second,
                                    source_param, 400);
    }
    request.payment_source = found->second;
  }

  const auto customer = scalars.find("customer");
  if (customer == scalars.end() || customer->second.empty()) {
    // PaymentIntents for off-session billing always name the customer; a
    // Charge needs a customer or a source to take the money from.
    if (is_intent) return errors::missing_param("customer");
    if (!request.payment_source) {
      return errors::invalid_param("source", "Must provide source or customer.");
    }
    return std::nullopt;
  }
  if (!starts_with(customer->second, "cus_")) {
    return errors::no_such_object("customer", customer->second, "customer", 400);
  }
  request.customer = customer->second;
  return std::nullopt;
}

// From API version 2023-08-16 a PaymentIntent that names no
// payment_method_types takes the automatic payment methods of the account's
// dashboard, some of which redirect the customer: confirming it then needs
// a return_url, unless redirects are ruled out (allow_redirects=never).
// Before, it took payment_method_types [card].
constexpr const char* kAutomaticByDefaultSince = "2023-08-16";

std::optional<StripeError> read_payment_method_choice(const SortedParams& sorted,
                                                      const std::string& api_version,
                                                      CreationRequest& request) {
  const auto& scalars = sorted.scalars;
  std::optional<bool> automatic;
  if (scalars.count("automatic_payment_methods[enabled]")) {
    bool enabled = false;
    if (auto error = read_boolean(scalars, "automatic_payment_methods[enabled]", enabled)) {
      return error;
    }
    automatic = enabled;
  }
  if (const auto found = scalars.find("automatic_payment_methods[allow_redirects]");
      found != scalars.end()) {
    if (found->second != "always" && found->second != "never") {
      return errors::invalid_param("automatic_payment_methods[allow_redirects]",
                                   "Invalid automatic_payment_methods[allow_redirects]: must be "
                                   "one of always, or never");
    }
    if (!automatic) return errors::missing_param("automatic_payment_methods[enabled]");
    request.allow_redirects = found->second;
  }
  if (automatic == true && !sorted.payment_method_types.empty()) {
    return errors::invalid_param(
        "payment_method_types",
        "You may only specify one of these parameters: automatic_payment_methods, "
        "payment_method_types.");
  }
  if (const auto found = scalars.find("return_url");
      found != scalars.end() && !found->second.empty()) {
    request.return_url = found->second;
  }
  const bool automatic_by_default = api_version.compare(0, 10, kAutomaticByDefaultSince) >= 0;
  request.automatic_payment_methods =
      automatic.value_or(automatic_by_default && sorted.payment_method_types.empty());
  request.payment_method_types = sorted.payment_method_types;
  if (!request.automatic_payment_methods && request.payment_method_types.empty()) {
    request.payment_method_types = {"card"};
  }
  if (request.automatic_payment_methods && request.allow_redirects.value_or("always") != "never" &&
      request.confirm && !request.return_url) {
    return errors::invalid_param(
        "return_url",
        "This PaymentIntent is configured to accept payment methods enabled in your Dashboard. "
        "Because some of these payment methods might redirect your customer off of your page, "
        "you must provide a `return_url`. If you don't want to accept redirect-based payment "
        "methods, set `automatic_payment_methods[enabled]` to `true` and "
        "`automatic_payment_methods[allow_redirects]` to `never` when creating Setup Intents "
        "and Payment Intents.");
  }
  return std::nullopt;
}

}  // namespace

CreationValidation validate_creation(ObjectKind kind, const FormParams& params,
                                     const std::string& api_version, bool on_connected_account) {
  SortedParams sorted;
  if (auto error = sort_params(kind, params, sorted)) return *error;

  CreationRequest request;
  request.kind = kind;
  if (auto error = read_amount_and_currency(sorted.scalars, request)) return *error;
  if (auto error = read_application_fee(sorted.scalars, on_connected_account, request)) {
    return *error;
  }
  if (auto error = read_customer_and_source(sorted.scalars, request)) return *error;
  if (auto error = read_boolean(sorted.scalars, "confirm", request.confirm)) return *error;
  if (auto error = read_boolean(sorted.scalars, "off_session", request.off_session)) return *error;
  if (kind == ObjectKind::payment_intent) {
    if (auto error = read_payment_method_choice(sorted, api_version, request)) return *error;
  }
  if (auto error = check_metadata(sorted.metadata)) return *error;

  if (const auto found = sorted.scalars.find("description");
      found != sorted.scalars.end() && !found->second.empty()) {
    request.description = found->second;
  }
  request.metadata = std::move(sorted.metadata);
  return request;
}

}  // namespace stripe_emulator
