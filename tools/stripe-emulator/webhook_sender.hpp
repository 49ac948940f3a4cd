// Delivers webhook events to the configured endpoint as Stripe does: each
// delivery signed when it is sent (Stripe-Signature: t=<unix time>,v1=<hex
// HMAC-SHA256 of "t.body" with the endpoint's secret>), and retried until
// the endpoint answers 2xx, so every event arrives at least once. One
// delivery at a time, in the order they fall due. Tests steer it through the
// control API: hold deliveries back, delay them, deliver each event more than
// once, or deliver one event again.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "webhook_client.hpp"
#include "webhook_events.hpp"

namespace stripe_emulator {

struct WebhookSettings {
  std::string url;  // empty: events are neither delivered nor kept
  std::string secret;
  // A Connect endpoint: connected accounts' events go there, signed with
  // its own secret. Empty: they go to `url` with the others.
  std::string connect_url;
  std::string connect_secret;
  bool hold = false;            // deliver nothing until released
  std::int64_t duplicate = 0;   // further deliveries of every event
  std::int64_t delay_ms = 0;    // an event's deliveries fall due this long after it
  std::int64_t retry_ms = 250;  // the first retry after a failure; doubling, at most 5 s
};

class WebhookSender {
 public:
  explicit WebhookSender(bool log_deliveries) : log_deliveries_(log_deliveries) {}

  // Replaces the settings; false, with `error`, when a URL is not
  // http://HOST[:PORT][/PATH], comes without its secret, or a Connect
  // endpoint comes without an account endpoint.
  bool configure(const WebhookSettings& settings, std::string& error);
  WebhookSettings settings() const;
  // Whether events are delivered at all: callers skip rendering them otherwise.
  bool enabled() const;

  void publish(const std::vector<WebhookEvent>& events);
  // One more delivery of an event published before; false when there is none.
  bool resend(const std::string& event_id);
  // Forgets every event and delivery; the settings stay.
  void clear();
  // The settings (the secret only as secret_set) and every delivery.
  std::string to_json() const;

  // The delivery loop, for a thread of its own; never returns.
  void run();

 private:
  struct Delivery {
    WebhookEvent event;
    std::chrono::steady_clock::time_point due;
    int attempts = 0;
    bool delivered = false;
    int last_status = 0;
    std::string last_error;
  };

  void queue_locked(const WebhookEvent& event);

  const bool log_deliveries_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  WebhookSettings settings_;
  WebhookEndpoint endpoint_;
  WebhookEndpoint connect_endpoint_;
  std::vector<Delivery> deliveries_;
  std::uint64_t generation_ = 0;  // bumped by clear(): a delivery in flight then is forgotten
};

}  // namespace stripe_emulator
