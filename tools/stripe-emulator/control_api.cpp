#include "control_api.hpp"

#include <set>

#include "json.hpp"
#include "random_ids.hpp"
#include "stripe_error_catalog.hpp"
#include "webhook_events.hpp"

namespace stripe_emulator {

namespace {

ApiResponse control_error(int status, std::string message) {
  return render_error(errors::plain_request_error(status, std::move(message)));
}

// A JSON object body whose member names are checked against `allowed`, so a
// misspelt option fails loudly instead of being silently ignored.
std::optional<JsonValue> parse_object_body(const std::string& body,
                                           const std::set<std::string>& allowed,
                                           std::string& error) {
  auto parsed = parse_json(body.empty() ? std::string("{}") : body, error);
  if (!parsed) {
    error = "Invalid JSON body: " + error;
    return std::nullopt;
  }
  if (parsed->type != JsonValue::Type::object) {
    error = "The body must be a JSON object.";
    return std::nullopt;
  }
  for (const auto& [name, value] : parsed->object_members) {
    if (!allowed.count(name)) {
      error = "Unknown field: " + name;
      return std::nullopt;
    }
  }
  return parsed;
}

// Reads an optional integer member within [minimum, maximum]; false on a bad value.
bool read_integer(const JsonValue& object, const char* name, std::int64_t minimum,
                  std::int64_t maximum, std::optional<std::int64_t>& out, std::string& error) {
  const JsonValue* member = object.member(name);
  if (!member) return true;
  if (member->type != JsonValue::Type::number || !member->is_integer ||
      member->integer_value < minimum || member->integer_value > maximum) {
    error = std::string(name) + " must be an integer from " + std::to_string(minimum) + " to " +
            std::to_string(maximum) + ".";
    return false;
  }
  out = member->integer_value;
  return true;
}

bool read_string(const JsonValue& object, const char* name, std::optional<std::string>& out,
                 std::string& error) {
  const JsonValue* member = object.member(name);
  if (!member) return true;
  if (member->type != JsonValue::Type::string) {
    error = std::string(name) + " must be a string.";
    return false;
  }
  out = member->string_value;
  return true;
}

bool read_boolean(const JsonValue& object, const char* name, std::optional<bool>& out,
                  std::string& error) {
  const JsonValue* member = object.member(name);
  if (!member) return true;
  if (member->type != JsonValue::Type::boolean) {
    error = std::string(name) + " must be true or false.";
    return false;
  }
  out = member->boolean_value;
  return true;
}

std::optional<FaultKind> fault_kind_from_name(const std::string& name) {
  if (name == "status") return FaultKind::status;
  if (name == "hang") return FaultKind::hang;
  if (name == "commit_then_drop") return FaultKind::commit_then_drop;
  return std::nullopt;
}

// Parses a fault request; on success fills `fault` and `count`, else returns why not.
std::optional<std::string> parse_fault(const std::string& body, Fault& fault, std::size_t& count) {
  std::string error;
  const auto object = parse_object_body(
      body, {"kind", "status", "count", "create", "executes", "path_prefix", "method"}, error);
  if (!object) return error;

  std::optional<std::string> kind_name, path_prefix, method;
  std::optional<std::int64_t> status, repetitions;
  std::optional<bool> create, executes;
  if (!read_string(*object, "kind", kind_name, error) ||
      !read_integer(*object, "status", 400, 599, status, error) ||
      !read_integer(*object, "count", 0, 1000000, repetitions, error) ||
      !read_boolean(*object, "create", create, error) ||
      !read_boolean(*object, "executes", executes, error) ||
      !read_string(*object, "path_prefix", path_prefix, error) ||
      !read_string(*object, "method", method, error)) {
    return error;
  }
  const auto kind = fault_kind_from_name(kind_name.value_or(""));
  if (!kind) return std::string("kind must be \"status\", \"hang\" or \"commit_then_drop\".");
  if (*kind == FaultKind::status && !status)
    return std::string("A status fault needs \"status\" (400-599).");
  if (*kind != FaultKind::status && status)
    return std::string("\"status\" only applies to kind \"status\".");
  if (create && !(*kind == FaultKind::status && *status == 500)) {
    return std::string("\"create\" only applies to status 500 faults.");
  }
  if (executes && !(*kind == FaultKind::status && *status == 500)) {
    return std::string("\"executes\" only applies to status 500 faults.");
  }
  if (create && executes == false) {
    return std::string("\"create\" only applies to a 500 that executes.");
  }
  if (path_prefix && (path_prefix->empty() || path_prefix->front() != '/')) {
    return std::string("path_prefix must start with '/'.");
  }
  if (method && *method != "GET" && *method != "POST" && *method != "ANY") {
    return std::string("method must be \"GET\", \"POST\" or \"ANY\".");
  }

  fault.kind = *kind;
  fault.status = static_cast<int>(status.value_or(0));
  fault.create = create.value_or(true);
  fault.executes = executes.value_or(true);
  fault.path_prefix = path_prefix.value_or("");
  fault.method = method.value_or("");
  count = static_cast<std::size_t>(repetitions.value_or(1));
  return std::nullopt;
}

ApiResponse ok(std::string body) {
  return ApiResponse{200, std::move(body)};
}

}  // namespace

HandlerResult ControlApi::handle(const HttpRequest& request) {
  ApiResponse response;
  const std::string& path = request.path;
  const bool get = request.method == "GET";
  const bool post = request.method == "POST";
  if (!request.peer_is_loopback) {
    response = control_error(403, "The emulator control API only answers loopback clients.");
  } else if (get && path == "/_emulator/ledger") {
    response = ledger();
  } else if (post && path == "/_emulator/faults") {
    response = queue_faults(request.body);
  } else if (get && path == "/_emulator/faults") {
    response = list_faults();
  } else if (post && path == "/_emulator/reset") {
    response = reset();
  } else if (get && path == "/_emulator/stats") {
    response = ok(state_.stats.to_json());
  } else if (post && path == "/_emulator/config") {
    response = update_config(request.body);
  } else if (get && path == "/_emulator/config") {
    response = config();
  } else if (post && path == "/_emulator/webhooks") {
    response = update_webhooks(request.body);
  } else if (get && path == "/_emulator/webhooks") {
    response = ok(state_.webhooks.to_json());
  } else if (post && path == "/_emulator/webhooks/resend") {
    response = resend_webhook(request.body);
  } else if (post && path == "/_emulator/refunds") {
    response = refund(request.body);
  } else {
    response =
        control_error(404, "Unrecognized control URL (" + request.method + ": " + path + ").");
  }
  HandlerResult result;
  result.response = json_response(response.status, std::move(response.body));
  return result;
}

ApiResponse ControlApi::ledger() const {
  JsonWriter json;
  json.begin_array();
  for (const auto& object : state_.ledger.all_in_creation_order()) write_ledger_entry(json, object);
  json.end_array();
  return ok(json.take());
}

ApiResponse ControlApi::queue_faults(const std::string& body) {
  Fault fault;
  std::size_t count = 1;
  if (auto problem = parse_fault(body, fault, count)) return control_error(400, *problem);
  const std::size_t queued = state_.faults.enqueue(fault, count);
  JsonWriter json;
  json.begin_object().key("queued").integer(static_cast<std::int64_t>(queued)).end_object();
  return ok(json.take());
}

ApiResponse ControlApi::list_faults() const {
  const auto queued = state_.faults.queued();
  std::size_t total = 0;
  JsonWriter json;
  json.begin_object().key("faults").begin_array();
  for (const auto& entry : queued) {
    total += entry.remaining;
    json.begin_object().key("kind").string(fault_kind_name(entry.fault.kind));
    if (entry.fault.kind == FaultKind::status) json.key("status").integer(entry.fault.status);
    if (entry.fault.kind == FaultKind::status && entry.fault.status == 500) {
      json.key("create").boolean(entry.fault.create).key("executes").boolean(entry.fault.executes);
    }
    json.key("count")
        .integer(static_cast<std::int64_t>(entry.remaining))
        .key("path_prefix")
        .string(entry.fault.path_prefix)
        .key("method")
        .string(entry.fault.method.empty() ? "default" : entry.fault.method)
        .end_object();
  }
  json.end_array().key("queued").integer(static_cast<std::int64_t>(total)).end_object();
  return ok(json.take());
}

ApiResponse ControlApi::reset() {
  state_.ledger.clear();
  state_.idempotency.clear();
  state_.faults.clear();
  state_.stats.reset();
  state_.rate_limiter.forget_history();
  state_.webhooks.clear();
  JsonWriter json;
  json.begin_object().key("reset").boolean(true).end_object();
  return ok(json.take());
}

ApiResponse ControlApi::update_config(const std::string& body) {
  std::string error;
  const auto object = parse_object_body(
      body, {"latency_ms", "rate_limit", "search_delay_ms", "idempotency_ttl", "refused_accounts"},
      error);
  if (!object) return control_error(400, error);
  std::optional<std::vector<std::string>> refused;
  if (const JsonValue* listed = object->member("refused_accounts")) {
    refused.emplace();
    const bool array = listed->type == JsonValue::Type::array;
    for (const JsonValue& item : array ? listed->array_items : std::vector<JsonValue>{}) {
      if (item.type != JsonValue::Type::string || item.string_value.rfind("acct_", 0) != 0) {
        refused.reset();
        break;
      }
      refused->push_back(item.string_value);
    }
    if (!array || !refused)
      return control_error(400, "refused_accounts must be a list of acct_ ids.");
  }
  std::optional<std::int64_t> latency_ms, rate_limit, search_delay_ms, idempotency_ttl;
  // Validate everything before changing anything.
  if (!read_integer(*object, "latency_ms", 0, 600000, latency_ms, error) ||
      !read_integer(*object, "rate_limit", 0, 1000000000, rate_limit, error) ||
      !read_integer(*object, "search_delay_ms", 0, 86400000, search_delay_ms, error) ||
      !read_integer(*object, "idempotency_ttl", 0, 315360000, idempotency_ttl, error)) {
    return control_error(400, error);
  }
  if (latency_ms) state_.settings.latency_ms = *latency_ms;
  if (rate_limit) state_.rate_limiter.set_limit(*rate_limit);
  if (search_delay_ms) state_.settings.search_delay_ms = *search_delay_ms;
  if (idempotency_ttl) state_.settings.idempotency_ttl_seconds = *idempotency_ttl;
  if (refused) state_.refused_accounts.replace(std::move(*refused));
  return config();
}

ApiResponse ControlApi::config() const {
  JsonWriter json;
  json.begin_object()
      .key("latency_ms")
      .integer(state_.settings.latency_ms.load())
      .key("rate_limit")
      .integer(state_.rate_limiter.limit())
      .key("search_delay_ms")
      .integer(state_.settings.search_delay_ms.load())
      .key("idempotency_ttl")
      .integer(state_.settings.idempotency_ttl_seconds.load())
      .key("refused_accounts")
      .begin_array();
  for (const std::string& account : state_.refused_accounts.list()) json.string(account);
  json.end_array().end_object();
  return ok(json.take());
}

ApiResponse ControlApi::update_webhooks(const std::string& body) {
  std::string error;
  const auto object = parse_object_body(body,
                                        {"url", "secret", "connect_url", "connect_secret", "hold",
                                         "duplicate", "delay_ms", "retry_ms"},
                                        error);
  if (!object) return control_error(400, error);
  std::optional<std::string> url, secret, connect_url, connect_secret;
  std::optional<bool> hold;
  std::optional<std::int64_t> duplicate, delay_ms, retry_ms;
  if (!read_string(*object, "url", url, error) || !read_string(*object, "secret", secret, error) ||
      !read_string(*object, "connect_url", connect_url, error) ||
      !read_string(*object, "connect_secret", connect_secret, error) ||
      !read_boolean(*object, "hold", hold, error) ||
      !read_integer(*object, "duplicate", 0, 100, duplicate, error) ||
      !read_integer(*object, "delay_ms", 0, 600000, delay_ms, error) ||
      !read_integer(*object, "retry_ms", 10, 60000, retry_ms, error)) {
    return control_error(400, error);
  }
  WebhookSettings settings = state_.webhooks.settings();
  if (url) settings.url = *url;
  if (secret) settings.secret = *secret;
  if (connect_url) settings.connect_url = *connect_url;
  if (connect_secret) settings.connect_secret = *connect_secret;
  if (hold) settings.hold = *hold;
  if (duplicate) settings.duplicate = *duplicate;
  if (delay_ms) settings.delay_ms = *delay_ms;
  if (retry_ms) settings.retry_ms = *retry_ms;
  if (!state_.webhooks.configure(settings, error)) return control_error(400, error);
  return ok(state_.webhooks.to_json());
}

ApiResponse ControlApi::resend_webhook(const std::string& body) {
  std::string error;
  const auto object = parse_object_body(body, {"event_id"}, error);
  if (!object) return control_error(400, error);
  std::optional<std::string> event_id;
  if (!read_string(*object, "event_id", event_id, error)) return control_error(400, error);
  if (!event_id) return control_error(400, "event_id is required.");
  if (!state_.webhooks.resend(*event_id)) {
    return control_error(404, "No webhook event " + *event_id + " was published.");
  }
  return ok(state_.webhooks.to_json());
}

// Refunds `amount` (default: what is left) of a succeeded PaymentIntent's
// charge or of a succeeded Charge, and publishes charge.refunded.
ApiResponse ControlApi::refund(const std::string& body) {
  std::string error;
  const auto object = parse_object_body(body, {"id", "amount"}, error);
  if (!object) return control_error(400, error);
  std::optional<std::string> id;
  std::optional<std::int64_t> amount;
  if (!read_string(*object, "id", id, error) ||
      !read_integer(*object, "amount", 1, 99999999, amount, error)) {
    return control_error(400, error);
  }
  if (!id) return control_error(400, "id (a pi_ or ch_ id) is required.");
  const ObjectKind kind =
      id->rfind("pi_", 0) == 0 ? ObjectKind::payment_intent : ObjectKind::charge;
  std::string refused;
  std::int64_t refunded = 0;
  const auto changed = state_.ledger.modify(kind, *id, [&](StripeObject& charged) {
    const std::int64_t left = charged.amount - charged.amount_refunded;
    refunded = amount.value_or(left);
    if (charged.status != "succeeded") {
      refused = *id + " is " + charged.status + ": only a succeeded charge can be refunded.";
    } else if (refunded < 1 || refunded > left) {
      refused = "amount must be 1.." + std::to_string(left) + " (what is left to refund).";
    } else {
      charged.amount_refunded += refunded;
    }
  });
  if (!changed) return control_error(404, "No such payment_intent or charge: " + *id);
  if (!refused.empty()) return control_error(400, refused);
  const WebhookEvent event = refund_event(*changed);
  state_.webhooks.publish({event});
  JsonWriter json;
  json.begin_object()
      .key("id")
      .string(new_object_id("re"))
      .key("object")
      .string("refund")
      .key("amount")
      .integer(refunded)
      .key("charge")
      .string(kind == ObjectKind::charge ? *id : changed->latest_charge.value_or(""))
      .key("payment_intent")
      .optional_string(kind == ObjectKind::payment_intent ? id : std::nullopt)
      .key("currency")
      .string(changed->currency)
      .key("status")
      .string("succeeded")
      .key("event_id")
      .string(event.id)
      .end_object();
  return ok(json.take());
}

}  // namespace stripe_emulator
