#include "stripe_api.hpp"

#include <cctype>
#include <chrono>
#include <thread>

#include "creation_params.hpp"
#include "stripe_endpoints.hpp"
#include "webhook_events.hpp"

namespace stripe_emulator {

namespace {

constexpr std::size_t kMaxIdempotencyKeyLength = 255;  // Stripe's limit
constexpr std::size_t kMaxAccountIdLength = 255;       // Stripe's ids are far shorter

HandlerResult answer(const ApiResponse& api_response, const std::string* idempotency_key = nullptr,
                     bool replayed = false) {
  HandlerResult result;
  result.response = json_response(api_response.status, api_response.body);
  if (idempotency_key) {
    result.response.headers.emplace_back("Idempotency-Key", *idempotency_key);
    result.response.headers.emplace_back("Idempotent-Replayed", replayed ? "true" : "false");
  }
  return result;
}

HandlerResult answer(const StripeError& error, const std::string* idempotency_key = nullptr) {
  HandlerResult result = answer(render_error(error), idempotency_key);
  if (error.http_status == 401) {
    result.response.headers.emplace_back("WWW-Authenticate", "Bearer realm=\"Stripe\"");
  }
  return result;
}

// What an injected status fault answers when it stops the request before the
// idempotency layer: nothing is created and nothing is saved for the key.
StripeError injected_status_error(int status) {
  return status == 429 ? errors::rate_limited() : errors::api_error(status);
}

bool lower_case_equals(const std::string& text, const char* lower) {
  std::size_t i = 0;
  for (; i < text.size() && lower[i]; ++i) {
    if (std::tolower(static_cast<unsigned char>(text[i])) != lower[i]) return false;
  }
  return i == text.size() && !lower[i];
}

}  // namespace

std::optional<StripeApi::Route> StripeApi::resolve_route(const std::string& method,
                                                         const std::string& path) {
  static const std::string kVersionPrefix = "/v1/";
  if (path.compare(0, kVersionPrefix.size(), kVersionPrefix) != 0) return std::nullopt;
  const std::string rest = path.substr(kVersionPrefix.size());
  const std::size_t slash = rest.find('/');
  const std::string collection = rest.substr(0, slash);
  Route route{Operation::list, ObjectKind::payment_intent, {}};
  if (collection == "payment_intents") {
    route.kind = ObjectKind::payment_intent;
  } else if (collection == "charges") {
    route.kind = ObjectKind::charge;
  } else {
    return std::nullopt;
  }
  if (slash == std::string::npos) {
    if (method == "POST") return Route{Operation::create, route.kind, {}};
    if (method == "GET") return Route{Operation::list, route.kind, {}};
    return std::nullopt;
  }
  const std::string member = rest.substr(slash + 1);
  if (member.empty() || member.find('/') != std::string::npos || method != "GET")
    return std::nullopt;
  if (member == "search") return Route{Operation::search, route.kind, {}};
  return Route{Operation::retrieve, route.kind, member};
}

std::optional<StripeError> StripeApi::authenticate(const HttpRequest& request,
                                                   std::string& api_key) const {
  const std::string* authorization = request.header("authorization");
  if (!authorization || authorization->empty()) return errors::missing_api_key();
  const std::size_t space = authorization->find(' ');
  if (space == std::string::npos || !lower_case_equals(authorization->substr(0, space), "bearer")) {
    return errors::unsupported_authorization_scheme();
  }
  const std::size_t key_start = authorization->find_first_not_of(' ', space);
  api_key = key_start == std::string::npos ? std::string() : authorization->substr(key_start);
  if (api_key.empty()) return errors::missing_api_key();
  if (state_.required_api_key && api_key != *state_.required_api_key) {
    return errors::invalid_api_key(api_key);
  }
  return std::nullopt;
}

std::optional<StripeError> StripeApi::connected_account(const HttpRequest& request,
                                                        const std::string& api_key,
                                                        std::optional<std::string>& account) const {
  const std::string* header = request.header("stripe-account");
  if (!header) return std::nullopt;  // the platform acts for itself
  // Any acct_ id of Stripe's shape is taken for a connected account of the
  // platform, but those the control API says refuse it; anything else names
  // no account the key may act on.
  static const std::string kPrefix = "acct_";
  const bool shaped =
      header->size() > kPrefix.size() && header->size() <= kMaxAccountIdLength &&
      header->compare(0, kPrefix.size(), kPrefix) == 0 &&
      header->find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
                                kPrefix.size()) == std::string::npos;
  if (!shaped || state_.refused_accounts.contains(*header)) {
    return errors::account_inaccessible(api_key, *header);
  }
  account = *header;
  return std::nullopt;
}

void StripeApi::sleep_for_configured_latency() const {
  const auto latency_ms = state_.settings.latency_ms.load();
  // Sleeping in the connection's own thread, holding no lock: concurrent
  // requests overlap exactly as they would against a slow remote API.
  if (latency_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(latency_ms));
}

HandlerResult StripeApi::handle(const HttpRequest& request) {
  InProgressRequest in_progress(state_.stats);
  ++state_.stats.requests;

  // Stripe's limiters run before everything else, so a 429 is never saved
  // for an idempotency key and a retry can succeed.
  if (!state_.rate_limiter.try_admit()) {
    ++state_.stats.rate_limited;
    return answer(errors::rate_limited());
  }

  std::string api_key;
  if (auto failure = authenticate(request, api_key)) return answer(*failure);
  std::optional<std::string> account;
  if (auto failure = connected_account(request, api_key, account)) return answer(*failure);

  const auto route = resolve_route(request.method, request.path);
  if (!route) return answer(errors::unrecognized_url(request.method, request.path));

  const auto params =
      decode_form(route->operation == Operation::create ? request.body : request.query);
  if (!params) return answer(errors::malformed_parameters());

  // A fault is consumed by the first matching request to get this far, even
  // if the request later turns out to be a replay or invalid.
  const std::optional<Fault> fault = state_.faults.take_matching(request.method, request.path);
  if (fault && fault->kind == FaultKind::hang) {
    // Taken before the idempotency layer, so the key is never left "in
    // flight": a retry is processed normally instead of getting 409s until
    // the hung connection closes. Equivalent to releasing it when the hang starts.
    ++state_.stats.faults_applied;
    HandlerResult hang;
    hang.after = AfterHandling::hang_until_client_closes;
    return hang;
  }
  const bool executes_despite_error = fault && fault->kind == FaultKind::status &&
                                      fault->status == 500 && fault->executes &&
                                      route->operation == Operation::create;
  if (fault && fault->kind == FaultKind::status && !executes_despite_error) {
    // 429, 502-504, a 500 that does not execute and the rest fail in front
    // of the API: nothing created, nothing saved.
    ++state_.stats.faults_applied;
    sleep_for_configured_latency();
    return answer(injected_status_error(fault->status));
  }

  HandlerResult result = route->operation == Operation::create
                             ? run_creation(request, *route, api_key, account, *params,
                                            executes_despite_error ? fault : std::nullopt)
                             : run_read(*route, account, *params);
  if (fault && fault->kind == FaultKind::commit_then_drop) {
    // Everything happened (object created, response saved); only the answer is lost.
    ++state_.stats.faults_applied;
    result.after = AfterHandling::drop_connection;
  }
  return result;
}

HandlerResult StripeApi::run_creation(const HttpRequest& request, const Route& route,
                                      const std::string& api_key,
                                      const std::optional<std::string>& account,
                                      const FormParams& params,
                                      const std::optional<Fault>& server_error) {
  const std::string* idempotency_key = request.header("idempotency-key");
  // Stripe keeps keys per account acted on: the same key on two connected
  // accounts, or on one and the platform, is two requests.
  const std::string scope = api_key + '\0' + account.value_or("");
  std::optional<std::uint64_t> ticket;
  if (idempotency_key) {
    if (idempotency_key->empty() || idempotency_key->size() > kMaxIdempotencyKeyLength) {
      return answer(errors::invalid_idempotency_key());
    }
    const std::string endpoint = request.method + " " + request.path;
    const auto ttl = std::chrono::seconds(state_.settings.idempotency_ttl_seconds.load());
    const IdempotencyClaim claim = state_.idempotency.claim(
        scope, *idempotency_key, endpoint, params, std::chrono::steady_clock::now(), ttl);
    // The key is registered before the latency, so a concurrent duplicate
    // arriving during the sleep sees it in flight and gets a 409.
    sleep_for_configured_latency();
    switch (claim.verdict) {
      case IdempotencyVerdict::replay:
        ++state_.stats.replayed;
        return answer(claim.saved_response, idempotency_key, true);
      case IdempotencyVerdict::different_request: {
        ++state_.stats.idempotency_conflicts;
        const std::string detail = claim.first_endpoint == endpoint
                                       ? std::string()
                                       : "This key was first used for " + claim.first_endpoint +
                                             ", not " + endpoint + ". ";
        return answer(errors::idempotency_mismatch(*idempotency_key, detail), idempotency_key);
      }
      case IdempotencyVerdict::in_use:
        ++state_.stats.in_use_conflicts;
        return answer(errors::idempotency_key_in_use(*idempotency_key), idempotency_key);
      case IdempotencyVerdict::fresh:
        ticket = claim.ticket;
        break;
    }
  } else {
    sleep_for_configured_latency();
  }

  const std::string* stripe_version = request.header("stripe-version");
  CreationValidation validation = validate_creation(
      route.kind, params,
      stripe_version && !stripe_version->empty() ? *stripe_version : state_.default_api_version,
      account.has_value());
  if (const auto* invalid = std::get_if<StripeError>(&validation)) {
    if (ticket) state_.idempotency.release(scope, *idempotency_key, *ticket);
    return answer(*invalid, idempotency_key);
  }
  auto& creation = std::get<CreationRequest>(validation);
  creation.account = account;
  const std::optional<std::string> key_for_ledger =
      idempotency_key ? std::optional<std::string>(*idempotency_key) : std::nullopt;

  ApiResponse response;
  if (server_error) {
    // The endpoint failed after it started executing: Stripe saves and
    // replays this 500 and may or may not have created the object; if it
    // did, its webhooks tell.
    ++state_.stats.faults_applied;
    if (server_error->create) {
      const Creation created = create_object(state_.ledger, creation, key_for_ledger);
      ++state_.stats.created;
      if (state_.webhooks.enabled()) state_.webhooks.publish(creation_events(created.object));
    }
    response = render_error(errors::api_error(500));
  } else {
    const Creation created = create_object(state_.ledger, creation, key_for_ledger);
    ++state_.stats.created;
    if (state_.webhooks.enabled()) state_.webhooks.publish(creation_events(created.object));
    response = created.response;
  }
  if (ticket) state_.idempotency.complete(scope, *idempotency_key, *ticket, response);
  return answer(response, idempotency_key);
}

HandlerResult StripeApi::run_read(const Route& route, const std::optional<std::string>& account,
                                  const FormParams& params) {
  sleep_for_configured_latency();
  switch (route.operation) {
    case Operation::retrieve:
      return answer(retrieve_object(state_.ledger, route.kind, route.object_id, account));
    case Operation::list:
      return answer(list_objects(state_.ledger, route.kind, params, account));
    case Operation::search:
      return answer(
          search_objects(state_.ledger, route.kind, params, account,
                         std::chrono::milliseconds(state_.settings.search_delay_ms.load())));
    case Operation::create:
      break;
  }
  return answer(errors::unrecognized_url("GET", "/v1"));
}

}  // namespace stripe_emulator
