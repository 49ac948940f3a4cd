// The proxy's routes (see router.hpp).
#include "router.hpp"

#include "stripe_errors.hpp"

namespace billguard::proxy {

void Router::Get(const std::string& pattern, Handler handler) {
  Add("GET", pattern, std::move(handler));
}

void Router::Post(const std::string& pattern, Handler handler) {
  Add("POST", pattern, std::move(handler));
}

void Router::Delete(const std::string& pattern, Handler handler) {
  Add("DELETE", pattern, std::move(handler));
}

void Router::Add(const std::string& method, const std::string& pattern, Handler handler) {
  routes_.push_back(Route{method, std::regex(pattern), std::move(handler)});
}

void Router::Dispatch(Request& request, Response& response) const {
  for (const Route& route : routes_) {
    std::smatch match;
    if (route.method != request.method || !std::regex_match(request.path, match, route.pattern)) {
      continue;
    }
    request.matches.assign(match.begin(), match.end());
    route.handler(request, response);
    return;
  }
  response.status = 404;
  response.set_content(StripeErrorBody("invalid_request_error", "resource_missing",
                                       "Unrecognized request URL (" + request.method.substr(0, 16) +
                                           ": " + request.path.substr(0, 200) + ")"),
                       "application/json");
}

}  // namespace billguard::proxy
