// What Stripe holds of a reserved key's attempts (see stripe_lookup.hpp).
#include "stripe_lookup.hpp"

#include <ctime>

#include "stripe_request.hpp"
#include "stripe_response.hpp"
#include "upstream_answer.hpp"

namespace billguard::proxy {

namespace {

// Stripe's clock and the database's may disagree by this much.
constexpr double kClockSkewSeconds = 300;
constexpr int kMaxListPages = 10;
constexpr std::size_t kListPageSize = 100;
// SearchAnswer::keyed_ids holds at most this many of a page.
constexpr std::size_t kMaxKeyedPerPage = 20;

bool AllOf(const std::string& text, bool (*allowed)(char)) {
  if (text.empty() || text.size() > 255) return false;
  for (char c : text) {
    if (!allowed(c)) return false;
  }
  return true;
}
bool IdCharacter(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}
// What a search query can quote without escapes: no quote, no backslash.
bool QueryCharacter(char c) {
  return IdCharacter(c) || c == '-' || c == '.' || c == ':';
}

std::string Utc(double unix_seconds) {
  const std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

Finding Uncertain(std::string reason) {
  Finding f;
  f.kind = Finding::Kind::kUncertain;
  f.reason = std::move(reason);
  return f;
}

// A look-up of the proxy's own: none of a client's headers goes with it,
// but for the account the request acted on (Stripe answers a connected
// account's objects only with its Stripe-Account).
HttpResponse Get(const Upstream& upstream, const std::optional<std::string>& account,
                 const std::string& path_and_query) {
  return upstream.Send("GET", path_and_query, "", ForwardedHeaders::OnAccount(account));
}

// What a 2xx creating the object would have counted: money moved or held.
bool Charged(const ChargeAnswer& object) {
  const std::string& s = object.object_status;
  if (object.object_type == "charge") {
    return s == "succeeded" || s == "pending" || object.paid.value_or(false);
  }
  return s == "succeeded" || s == "processing" || s == "requires_capture";
}

enum class Fetched { kCharged, kNotCharged, kFailed };

// GET endpoint/id: the object as Stripe holds it now.
Fetched Fetch(const Upstream& upstream, const std::optional<std::string>& account,
              const std::string& endpoint, const std::string& id, Finding* found) {
  if (!AllOf(id, IdCharacter)) return Fetched::kFailed;
  const HttpResponse response = Get(upstream, account, endpoint + "/" + id);
  if (response.status != 200) return Fetched::kFailed;
  const ChargeAnswer object = ReadChargeAnswer(response);
  if (object.object_id != id) return Fetched::kFailed;
  if (!Charged(object)) return Fetched::kNotCharged;
  found->kind = Finding::Kind::kFound;
  found->charge_id = id;
  found->body = StorableText(response.body);
  found->request_id = object.request_id;
  return Fetched::kCharged;
}

// Fetches every object of `answer` carrying the key: kCharged with the
// first charged one in *found, kFailed if one could not be fetched.
Fetched FetchKeyed(const Upstream& upstream, const std::optional<std::string>& account,
                   const std::string& endpoint, const SearchAnswer& answer, Finding* found) {
  Fetched result = Fetched::kNotCharged;
  for (const std::string& id : answer.keyed_ids) {
    const Fetched fetched = Fetch(upstream, account, endpoint, id, found);
    if (fetched == Fetched::kCharged) return fetched;
    if (fetched == Fetched::kFailed) result = Fetched::kFailed;
  }
  return result;
}

}  // namespace

Finding LookUp(const Upstream& upstream, const ReservationInDoubt& r, int quiet_s, double now) {
  if (r.endpoint != "/v1/payment_intents" && r.endpoint != "/v1/charges") {
    return Uncertain(
        "only charges made with POST /v1/payment_intents or /v1/charges can be "
        "looked up at Stripe, not " +
        r.endpoint);
  }
  if (!r.search_key) {
    return Uncertain("the request carried no metadata[billguard_key] to look its charge up by");
  }
  const std::string& key = *r.search_key;
  if (!AllOf(key, QueryCharacter)) {
    return Uncertain("its metadata[billguard_key] holds characters a search query cannot quote");
  }

  Finding found;
  const HttpResponse searched = Get(upstream, r.stripe_account, SearchPath(r.endpoint, key));
  const SearchAnswer search = ReadSearchAnswer(searched, key);
  if (!search.listed) {
    return Uncertain("Stripe's search answered HTTP " + std::to_string(search.http_status));
  }
  const Fetched by_search = FetchKeyed(upstream, r.stripe_account, r.endpoint, search, &found);
  if (by_search == Fetched::kCharged) {
    found.reason = "found " + found.charge_id + " by Stripe's search for metadata[billguard_key]";
    return found;
  }

  // The customer's list finds a charge the search has not indexed yet and,
  // read back to before the reservation, proves an absence.
  const double quiet = now - r.last_forwarded_at;
  const bool listable = r.customer && AllOf(*r.customer, IdCharacter);
  const double since = r.reserved_at - kClockSkewSeconds;
  std::size_t seen = 0;
  bool read_back = false;
  std::string after;
  for (int page = 0; listable && !read_back && page < kMaxListPages; ++page) {
    const HttpResponse listed =
        Get(upstream, r.stripe_account,
            r.endpoint + "?customer=" + PercentEncode(*r.customer) +
                "&limit=" + std::to_string(kListPageSize) +
                (after.empty() ? "" : "&starting_after=" + PercentEncode(after)));
    const SearchAnswer list = ReadSearchAnswer(listed, key);
    if (!list.listed) {
      return Uncertain("Stripe's list of " + *r.customer + "'s objects answered HTTP " +
                       std::to_string(list.http_status));
    }
    if (list.keyed_ids.size() >= kMaxKeyedPerPage) {
      return Uncertain("too many of " + *r.customer + "'s objects carry the key to fetch");
    }
    const Fetched fetched = FetchKeyed(upstream, r.stripe_account, r.endpoint, list, &found);
    if (fetched == Fetched::kCharged) {
      found.reason = "found " + found.charge_id + " in the list of " + *r.customer + "'s objects";
      return found;
    }
    if (fetched == Fetched::kFailed) {
      return Uncertain("an object carrying the key could not be fetched");
    }
    seen += list.elements;
    read_back = !list.has_more || list.elements == 0 ||
                (list.oldest_created >= 0 && list.oldest_created < since);
    if (!read_back && (list.oldest_created < 0 || list.last_id.empty())) {
      return Uncertain("Stripe's list does not say where its page ends");
    }
    after = list.last_id;
  }

  if (!listable) {
    return Uncertain(
        "Stripe's search found no charge, which proves nothing (its index lags), and without "
        "the request's customer the list that would prove it cannot be read");
  }
  if (!read_back) {
    return Uncertain(*r.customer + " has more than " + std::to_string(seen) + " objects since " +
                     Utc(since) + ": more than the lookup reads");
  }
  if (by_search == Fetched::kFailed) {
    return Uncertain("an object carrying the key could not be fetched");
  }
  // An attempt still on its way may yet create what the list does not show.
  if (quiet < quiet_s) {
    return Uncertain("its last attempt was forwarded " + std::to_string(static_cast<long>(quiet)) +
                     " s ago; Stripe's silence counts once none has been for " +
                     std::to_string(quiet_s) + " s");
  }
  Finding absent;
  absent.kind = Finding::Kind::kAbsent;
  absent.reason = "no charge carries metadata[billguard_key] " + key +
                  ": not in Stripe's search, nor among the " + std::to_string(seen) +
                  " objects of " + *r.customer + " since " + Utc(since) +
                  " (a list, immediately consistent), and no attempt for " +
                  std::to_string(static_cast<long>(quiet)) + " s";
  return absent;
}

}  // namespace billguard::proxy
