#include "webhook_sender.hpp"

#include <algorithm>
#include <cstdio>
#include <ctime>

#include "hmac_sha256.hpp"
#include "json.hpp"

namespace stripe_emulator {

namespace {

constexpr int kTimeoutMs = 10000;
constexpr std::int64_t kLongestRetryMs = 5000;

}  // namespace

bool WebhookSender::configure(const WebhookSettings& settings, std::string& error) {
  WebhookEndpoint endpoint, connect_endpoint;
  if (!settings.url.empty() && !parse_webhook_url(settings.url, endpoint, error)) return false;
  if (!settings.url.empty() && settings.secret.empty()) {
    error = "a webhook URL needs a webhook secret to sign with";
    return false;
  }
  if (!settings.connect_url.empty()) {
    if (!parse_webhook_url(settings.connect_url, connect_endpoint, error)) return false;
    if (settings.connect_secret.empty()) {
      error = "a Connect endpoint needs its own webhook secret to sign with";
      return false;
    }
    if (settings.url.empty()) {
      error = "a Connect endpoint needs the account endpoint (url) too";
      return false;
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  settings_ = settings;
  endpoint_ = endpoint;
  connect_endpoint_ = connect_endpoint;
  changed_.notify_all();
  return true;
}

WebhookSettings WebhookSender::settings() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return settings_;
}

bool WebhookSender::enabled() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !settings_.url.empty();
}

void WebhookSender::queue_locked(const WebhookEvent& event) {
  Delivery delivery;
  delivery.event = event;
  delivery.due = std::chrono::steady_clock::now() + std::chrono::milliseconds(settings_.delay_ms);
  deliveries_.push_back(delivery);
}

void WebhookSender::publish(const std::vector<WebhookEvent>& events) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (settings_.url.empty()) return;
  for (const auto& event : events) {
    for (std::int64_t copy = 0; copy <= settings_.duplicate; ++copy) queue_locked(event);
  }
  changed_.notify_all();
}

bool WebhookSender::resend(const std::string& event_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto found = std::find_if(deliveries_.begin(), deliveries_.end(),
                                  [&](const Delivery& d) { return d.event.id == event_id; });
  if (found == deliveries_.end()) return false;
  queue_locked(WebhookEvent(found->event));
  changed_.notify_all();
  return true;
}

void WebhookSender::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  deliveries_.clear();
  ++generation_;
}

std::string WebhookSender::to_json() const {
  std::lock_guard<std::mutex> lock(mutex_);
  JsonWriter json;
  json.begin_object()
      .key("url")
      .string(settings_.url)
      .key("secret_set")
      .boolean(!settings_.secret.empty())
      .key("connect_url")
      .string(settings_.connect_url)
      .key("connect_secret_set")
      .boolean(!settings_.connect_secret.empty())
      .key("hold")
      .boolean(settings_.hold)
      .key("duplicate")
      .integer(settings_.duplicate)
      .key("delay_ms")
      .integer(settings_.delay_ms)
      .key("retry_ms")
      .integer(settings_.retry_ms)
      .key("deliveries")
      .begin_array();
  std::int64_t pending = 0;
  for (const auto& d : deliveries_) {
    pending += d.delivered ? 0 : 1;
    json.begin_object()
        .key("event_id")
        .string(d.event.id)
        .key("type")
        .string(d.event.type)
        .key("object_id")
        .string(d.event.object_id)
        .key("endpoint")
        .string(d.event.connect && !settings_.connect_url.empty() ? "connect" : "account")
        .key("attempts")
        .integer(d.attempts)
        .key("delivered")
        .boolean(d.delivered)
        .key("last_status")
        .integer(d.last_status)
        .key("last_error")
        .string(d.last_error)
        .end_object();
  }
  json.end_array().key("pending").integer(pending).end_object();
  return json.take();
}

void WebhookSender::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    auto next = deliveries_.end();
    if (!settings_.hold && !settings_.url.empty()) {
      for (auto d = deliveries_.begin(); d != deliveries_.end(); ++d) {
        if (!d->delivered && (next == deliveries_.end() || d->due < next->due)) next = d;
      }
    }
    if (next == deliveries_.end()) {
      changed_.wait(lock);
      continue;
    }
    if (next->due > std::chrono::steady_clock::now()) {
      changed_.wait_until(lock, next->due);
      continue;
    }
    // Sent without the lock: the control API and new events never wait for
    // a slow endpoint.
    const std::size_t index = static_cast<std::size_t>(next - deliveries_.begin());
    const std::uint64_t generation = generation_;
    const WebhookEvent event = next->event;
    const bool to_connect = event.connect && !settings_.connect_url.empty();
    const WebhookEndpoint endpoint = to_connect ? connect_endpoint_ : endpoint_;
    const std::string secret = to_connect ? settings_.connect_secret : settings_.secret;
    const std::int64_t retry_ms = settings_.retry_ms;
    lock.unlock();
    const std::string t = std::to_string(static_cast<long long>(std::time(nullptr)));
    const HeaderList headers = {
        {"Content-Type", "application/json; charset=utf-8"},
        {"User-Agent", "Stripe/1.0 (+https://stripe.com/docs/webhooks)"},
        {"Stripe-Signature", "t=" + t + ",v1=" + hmac_sha256_hex(secret, t + "." + event.json)}};
    const PostResult result = post_webhook(endpoint, headers, event.json, kTimeoutMs);
    lock.lock();
    if (log_deliveries_) {
      std::fprintf(stderr, "WEBHOOK %s %s -> %d%s%s\n", event.id.c_str(), event.type.c_str(),
                   result.status, result.error.empty() ? "" : " ", result.error.c_str());
    }
    if (generation != generation_) continue;
    Delivery& delivery = deliveries_[index];
    ++delivery.attempts;
    delivery.last_status = result.status;
    delivery.last_error = result.error;
    if (result.status >= 200 && result.status < 300) {
      delivery.delivered = true;
    } else {
      const std::int64_t backoff =
          std::min(kLongestRetryMs, retry_ms << std::min(delivery.attempts - 1, 20));
      delivery.due = std::chrono::steady_clock::now() + std::chrono::milliseconds(backoff);
    }
  }
}

}  // namespace stripe_emulator
