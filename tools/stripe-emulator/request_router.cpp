#include "request_router.hpp"

#include "stripe_error_catalog.hpp"

namespace stripe_emulator {

namespace {

bool starts_with(const std::string& text, const char* prefix) {
  return text.compare(0, std::char_traits<char>::length(prefix), prefix) == 0;
}

}  // namespace

HandlerResult RequestRouter::route(const HttpRequest& request) {
  if (request.path == "/v1" || starts_with(request.path, "/v1/"))
    return stripe_api_.handle(request);
  if (starts_with(request.path, "/_emulator/")) return control_api_.handle(request);
  const ApiResponse unknown = render_error(errors::unrecognized_url(request.method, request.path));
  HandlerResult result;
  result.response = json_response(unknown.status, unknown.body);
  return result;
}

}  // namespace stripe_emulator
