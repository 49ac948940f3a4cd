// Reading Stripe's answers (see stripe_response.hpp).
#include "cpp_only.hpp"

#include "stripe_response.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>

namespace billguard {

namespace {

constexpr std::size_t kMaxFieldBytes = 255;
constexpr std::size_t kMaxMessageBytes = 500;

// A SAX reader (nlohmann's parser is iterative, so no nesting depth can
// exhaust the stack) that keeps only scalars at a few known places.
// Containers are counted, never built. Subclasses see each scalar with the
// depth of its container and the key it is under (empty in arrays).
class FieldReader : public nlohmann::json_sax<nlohmann::json> {
 public:
  bool null() override { return Scalar(nullptr, nullptr); }
  bool boolean(bool value) override { return Scalar(nullptr, &value); }
  bool number_integer(number_integer_t value) override {
    const long long integer = value;
    return Scalar(nullptr, nullptr, &integer);
  }
  bool number_unsigned(number_unsigned_t value) override {
    if (value > static_cast<number_unsigned_t>(INT64_MAX)) return Scalar(nullptr, nullptr);
    const long long integer = static_cast<long long>(value);
    return Scalar(nullptr, nullptr, &integer);
  }
  bool number_float(number_float_t, const string_t&) override { return Scalar(nullptr, nullptr); }
  bool string(string_t& value) override { return Scalar(&value, nullptr); }
  bool binary(binary_t&) override { return Scalar(nullptr, nullptr); }
  bool key(string_t& name) override {
    if (depth_ <= kTrackedDepth) keys_[depth_] = name;
    return true;
  }
  bool start_object(std::size_t) override { return Open(true); }
  bool end_object() override { return Close(true); }
  bool start_array(std::size_t) override { return Open(false); }
  bool end_array() override { return Close(false); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }

  // Whether `body` is one well-formed JSON object.
  bool Read(std::string_view body) {
    try {
      return nlohmann::json::sax_parse(body.begin(), body.end(), this) && top_is_object_;
    } catch (...) {
      return false;  // out of memory: as good as unreadable
    }
  }

 protected:
  static constexpr int kTrackedDepth = 4;
  // The key a value at `depth` is under; depth 1 is the top-level object.
  const std::string& KeyAt(int depth) const { return keys_[depth]; }
  int depth() const { return depth_; }
  virtual void OnString(const std::string&) {}
  virtual void OnBool(bool) {}
  virtual void OnInteger(long long) {}
  virtual void OnOpen(bool /*object*/) {}
  virtual void OnClose(bool /*object*/) {}

 private:
  bool Scalar(const std::string* text, const bool* flag, const long long* integer = nullptr) {
    if (depth_ == 0) return true;  // a bare scalar: not an object, see Read
    if (depth_ <= kTrackedDepth) {
      if (text != nullptr) OnString(*text);
      if (flag != nullptr) OnBool(*flag);
      if (integer != nullptr) OnInteger(*integer);
      if (in_array_[depth_]) keys_[depth_].clear();
    }
    return true;
  }
  bool Open(bool object) {
    if (depth_ == 0) top_is_object_ = object;
    ++depth_;
    if (depth_ <= kTrackedDepth) {
      keys_[depth_].clear();
      in_array_[depth_] = !object;
      OnOpen(object);
    }
    return true;
  }
  bool Close(bool object) {
    if (depth_ <= kTrackedDepth) OnClose(object);
    --depth_;
    return true;
  }

  int depth_ = 0;
  bool top_is_object_ = false;
  std::string keys_[kTrackedDepth + 1];
  bool in_array_[kTrackedDepth + 1] = {};
};

// {"id", "object", "status", "paid", "error": {"type", "code",
// "decline_code", "message"}}
class ChargeBodyReader : public FieldReader {
 public:
  explicit ChargeBodyReader(ChargeAnswer& answer) : answer_(answer) {}

 private:
  void OnString(const std::string& value) override {
    if (depth() == 1) {
      const std::string& key = KeyAt(1);
      if (key == "id") answer_.object_id = PrintableExcerpt(value, kMaxFieldBytes);
      if (key == "object") answer_.object_type = PrintableExcerpt(value, kMaxFieldBytes);
      if (key == "status") answer_.object_status = PrintableExcerpt(value, kMaxFieldBytes);
    } else if (depth() == 2 && KeyAt(1) == "error") {
      const std::string& key = KeyAt(2);
      if (key == "type") answer_.error_type = PrintableExcerpt(value, kMaxFieldBytes);
      if (key == "code") answer_.error_code = PrintableExcerpt(value, kMaxFieldBytes);
      if (key == "decline_code") answer_.decline_code = PrintableExcerpt(value, kMaxFieldBytes);
      if (key == "message") answer_.message = PrintableExcerpt(value, kMaxMessageBytes);
    }
  }
  void OnBool(bool value) override {
    if (depth() == 1 && KeyAt(1) == "paid") answer_.paid = value;
  }

  ChargeAnswer& answer_;
};

// {"data": [{"id", "status", "paid", "created", "amount", "currency",
// "customer", "metadata": {"billguard_key"}}, ...], "has_more"}: every
// element that carries the key and was charged, in order; every element
// that carries the key; and where the page ends.
class SearchBodyReader : public FieldReader {
 public:
  SearchBodyReader(SearchAnswer& answer, std::string_view key) : answer_(answer), key_(key) {}

 private:
  static constexpr std::size_t kMaxKeyedIds = 20;
  bool InElement() const { return KeyAt(1) == "data"; }
  void OnOpen(bool object) override {
    if (depth() == 2 && KeyAt(1) == "data" && !object) answer_.listed = true;
    if (depth() == 3 && InElement() && object) element_ = Element{};
  }
  void OnClose(bool object) override {
    if (depth() != 3 || !InElement() || !object) return;
    ++answer_.elements;
    if (!element_.found.id.empty()) answer_.last_id = element_.found.id;
    if (element_.created >= 0 &&
        (answer_.oldest_created < 0 || element_.created < answer_.oldest_created)) {
      answer_.oldest_created = element_.created;
    }
    if (element_.key != key_ || element_.found.id.empty()) return;
    if (answer_.keyed_ids.size() < kMaxKeyedIds) answer_.keyed_ids.push_back(element_.found.id);
    const bool charged =
        element_.status == "succeeded" || element_.status == "processing" || element_.paid;
    if (!charged || answer_.found.size() >= kMaxFound) return;
    if (answer_.found_id.empty()) answer_.found_id = element_.found.id;
    answer_.found.push_back(std::move(element_.found));
  }
  void OnString(const std::string& value) override {
    if (depth() == 3 && InElement()) {
      const std::string& key = KeyAt(3);
      if (key == "id") element_.found.id = PrintableExcerpt(value, kMaxFieldBytes);
      if (key == "status") element_.status = value.substr(0, kMaxFieldBytes);
      if (key == "currency") element_.found.currency = PrintableExcerpt(value, kMaxFieldBytes);
      if (key == "customer") element_.found.customer = PrintableExcerpt(value, kMaxFieldBytes);
    } else if (depth() == 4 && InElement() && KeyAt(3) == "metadata" &&
               KeyAt(4) == "billguard_key") {
      element_.key = value.substr(0, kMaxFieldBytes);
    }
  }
  void OnBool(bool value) override {
    if (depth() == 3 && InElement() && KeyAt(3) == "paid") element_.paid = value;
    if (depth() == 1 && KeyAt(1) == "has_more") answer_.has_more = value;
  }
  void OnInteger(long long value) override {
    if (depth() != 3 || !InElement()) return;
    if (KeyAt(3) == "created") element_.created = value;
    if (KeyAt(3) == "amount") element_.found.amount = value;
  }

  struct Element {
    FoundCharge found;
    std::string status, key;
    bool paid = false;
    long long created = -1;
  };
  SearchAnswer& answer_;
  std::string_view key_;
  Element element_;
};

std::optional<bool> HeaderFlag(const std::string& value) {
  std::string lower;
  for (char c : value) lower.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c));
  if (lower == "true") return true;
  if (lower == "false") return false;
  return std::nullopt;
}

bool IsSuccess(long status) {
  return status >= 200 && status <= 299;
}
bool IsClientError(long status) {
  return status >= 400 && status <= 499;
}

// An answer that said "try again" once max_attempts are spent. Only a 4xx
// proves nothing was charged.
Outcome Exhausted(ChargeAnswer& answer) {
  answer.message += std::string(answer.message.empty() ? "" : " ") +
                    "(attempts exhausted, outcome unknown: reconcile before retrying)";
  return IsClientError(answer.http_status) ? Outcome::kFailed : Outcome::kNeedsReview;
}

}  // namespace

const char* OutcomeName(Outcome outcome) {
  switch (outcome) {
    case Outcome::kCompleted:
      return "completed";
    case Outcome::kFailed:
      return "failed";
    case Outcome::kRetry:
      return "retry";
    case Outcome::kThrottled:
      return "throttled";
    case Outcome::kUnknown:
      return "unknown";
    case Outcome::kNeedsReview:
      return "needs_review";
    case Outcome::kPaused:
      return "paused";
    case Outcome::kNotSent:
      return "not_sent";
    case Outcome::kAbsent:
      return "absent";
    case Outcome::kBlocked:
      return "blocked";
  }
  return "needs_review";
}

std::string PrintableExcerpt(std::string_view text, std::size_t max_bytes) {
  std::string out(text.substr(0, max_bytes));
  for (char& c : out) {
    if (c < 0x20 || c > 0x7e) c = '?';
  }
  return out;
}

ChargeAnswer ReadChargeAnswer(const HttpResponse& response) {
  ChargeAnswer answer;
  answer.http_status = response.status;
  answer.request_id = PrintableExcerpt(response.request_id, kMaxFieldBytes);
  if (response.status == 0) {
    answer.request_sent = response.request_sent;
    answer.error_type = "network";
    answer.message = PrintableExcerpt(response.transport_error, kMaxMessageBytes);
    return answer;
  }
  answer.replayed = HeaderFlag(response.idempotent_replayed).value_or(false);
  answer.should_retry = HeaderFlag(response.should_retry);
  // Fields of a body that turns out malformed are dropped: half an answer
  // is no answer.
  ChargeAnswer read = answer;
  ChargeBodyReader reader(read);
  if (reader.Read(response.body)) return read;
  answer.body_excerpt = PrintableExcerpt(response.body, kMaxMessageBytes);
  return answer;
}

// Stripe's documented semantics, after the proxy's spend-cap refusals
// (told apart from Stripe's 429 by the error code of the body alone): a 2xx is the object (charged
// or not, by its status); 401/403 a refused key; an idempotency_error other than key-in-use a
// conflict a person must see; Stripe-Should-Retry decides when present; a 500 is cached by Stripe
// and indeterminate; 409, 429 and other 5xx are retried with the same key; other 4xx are
// definitive. Only a 4xx or a decline proves the customer was not charged, so an indeterminate
// answer past max_attempts needs review, never 'failed'.
Outcome JudgeCharge(ChargeAnswer& answer, int attempt, int max_attempts,
                    bool on_connected_account) {
  const long status = answer.http_status;
  if (status == 0 && !answer.request_sent) return Outcome::kNotSent;
  if (IsSuccess(status)) {
    if (answer.object_id.empty()) {
      answer.error_type = "api_error";
      answer.message = "success response without an object id";
      return Outcome::kNeedsReview;
    }
    const std::string& s = answer.object_status;
    if (!s.empty() && s != "succeeded" && s != "processing" && s != "pending") {
      answer.error_type = "payment_status";
      answer.error_code = s;
      answer.message = answer.object_type + " " + answer.object_id + " is " + s + ": not charged";
      return Outcome::kFailed;
    }
    return Outcome::kCompleted;
  }
  // Nothing was sent upstream, and the budget will not grow by itself:
  // sending again could only be refused again, or pass a raised cap later
  // by a person's decision (retry_record), never by a retry loop.
  if ((status == 429 && answer.error_code == kSpendCapExceeded) ||
      (status == 403 && answer.error_code == kCurrencyNotAllowed)) {
    return Outcome::kBlocked;
  }
  // Nothing was sent upstream either, but the proxy's answer may change in
  // a moment: never terminal, never a new key.
  if ((status == 429 && answer.error_code == kSpendCapPending) ||
      (status == 409 && answer.error_code == kReservationReconciling)) {
    return Outcome::kThrottled;
  }
  // A connected account the platform may no longer act on (its access
  // revoked, an account Stripe does not know) refuses that account's
  // charges only: they fail with Stripe's word, and every other account is
  // still billed. A 403 is given before anything executes: nothing charged.
  // Any other 403 (a restricted key without a permission) is the key's.
  if (status == 403 && on_connected_account &&
      answer.message.find(kNoAccessToAccount) != std::string::npos) {
    return Outcome::kFailed;
  }
  if (status == 401 || status == 403) return Outcome::kPaused;
  if (answer.error_type == "idempotency_error" && answer.error_code != "idempotency_key_in_use")
    return Outcome::kNeedsReview;

  if (answer.should_retry != true) {
    // Stripe replays a cached 500 for the key: past max_attempts of searching
    // and re-sending, only a person can settle it.
    if (status == 500) return attempt < max_attempts ? Outcome::kUnknown : Exhausted(answer);
    if (answer.should_retry == false ||
        (status != 0 && status < 500 && status != 409 && status != 429)) {
      return IsClientError(status) ? Outcome::kFailed : Outcome::kNeedsReview;
    }
  }
  // Rate limits and a key still in use say nothing about the charge: they
  // never exhaust the attempts.
  if (status == 409 || status == 429) return Outcome::kThrottled;
  return attempt < max_attempts ? Outcome::kRetry : Exhausted(answer);
}

SearchAnswer ReadSearchAnswer(const HttpResponse& response, std::string_view idempotency_key) {
  SearchAnswer answer;
  answer.http_status = response.status;
  answer.request_sent = response.status != 0 || response.request_sent;
  answer.request_id = PrintableExcerpt(response.request_id, kMaxFieldBytes);
  if (response.status == 0) {
    answer.message = "network: " + PrintableExcerpt(response.transport_error, kMaxMessageBytes);
    return answer;
  }
  if (response.status == 200) {
    SearchAnswer read = answer;
    SearchBodyReader reader(read, idempotency_key);
    if (reader.Read(response.body)) answer = read;
  }
  if (!answer.listed) answer.message = "search failed with HTTP " + std::to_string(response.status);
  return answer;
}

// A search changes nothing at Stripe: it never exhausts, and while it
// tells nothing the record stays unknown. Finding nothing is what ends the
// cycle of a 500 that created nothing: Stripe replays that 500 for the key
// to every re-send, so after max_unknown_cycles only a person can settle it.
Outcome JudgeSearch(SearchAnswer& answer, int unknown_cycles, int max_unknown_cycles,
                    bool on_connected_account) {
  if (!answer.request_sent) return Outcome::kNotSent;
  // A connected account that refuses the platform keeps its own records
  // unknown (searched again later), never the whole dispatcher waiting.
  if (answer.http_status == 403 && on_connected_account) return Outcome::kRetry;
  if (answer.http_status == 401 || answer.http_status == 403) return Outcome::kPaused;
  if (!answer.listed) return Outcome::kRetry;
  if (!answer.found_id.empty()) return Outcome::kCompleted;
  if (unknown_cycles < max_unknown_cycles) return Outcome::kAbsent;
  answer.message = "no charge found for the key after " + std::to_string(unknown_cycles) +
                   " indeterminate answers, each followed by a search " +
                   "(max_unknown_cycles): reconcile before retrying";
  return Outcome::kNeedsReview;
}

}  // namespace billguard
