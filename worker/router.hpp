// The proxy's routes: a method and a pattern of the raw path (never
// decoded) per handler; anything else is Stripe's 404 "Unrecognized
// request URL".
#pragma once

#include <functional>
#include <regex>
#include <string>
#include <vector>

#include "http_message.hpp"

namespace billguard::proxy {

using Handler = std::function<void(const Request&, Response&)>;

class Router {
 public:
  void Get(const std::string& pattern, Handler handler);
  void Post(const std::string& pattern, Handler handler);
  void Delete(const std::string& pattern, Handler handler);

  // Runs the first route whose method is the request's and whose pattern
  // matches its whole path, with the pattern's groups in request.matches.
  void Dispatch(Request& request, Response& response) const;

 private:
  struct Route {
    std::string method;
    std::regex pattern;
    Handler handler;
  };
  void Add(const std::string& method, const std::string& pattern, Handler handler);

  std::vector<Route> routes_;
};

}  // namespace billguard::proxy
