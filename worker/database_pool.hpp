// A small pool of libpqxx connections shared by the proxy's threads. One
// connection per call at a time; a connection that broke is dropped and a
// new one opened by the next call, so the proxy reconnects by itself after
// a database restart.
#pragma once

#include <pqxx/pqxx>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace billguard::proxy {

// The database cannot be reached (down, restarting, connections exhausted):
// the proxy answers 503 and forwards nothing.
class DatabaseUnavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class DatabasePool {
 public:
  // `prepare` runs on every new connection (prepared statements).
  DatabasePool(std::string conninfo, std::size_t size,
               std::function<void(pqxx::connection&)> prepare);

  // Runs fn on a connection. Throws DatabaseUnavailable when no connection
  // can be had or it broke during fn; pqxx::sql_error passes through.
  template <typename Fn>
  auto Run(Fn&& fn) -> decltype(fn(std::declval<pqxx::connection&>())) {
    Lease lease(*this);
    try {
      return fn(*lease.connection);
    } catch (const pqxx::broken_connection& e) {
      lease.broken = true;
      throw DatabaseUnavailable(e.what());
    } catch (const pqxx::sql_error& e) {
      // The server ending our session (shutdown, restart) or refusing it.
      const std::string state = e.sqlstate();
      if (state.rfind("08", 0) == 0 || state.rfind("57P", 0) == 0 || !lease.connection->is_open()) {
        lease.broken = true;
        throw DatabaseUnavailable(e.what());
      }
      throw;
    }
  }

 private:
  struct Lease {
    explicit Lease(DatabasePool& pool);
    ~Lease();
    DatabasePool& pool;
    std::unique_ptr<pqxx::connection> connection;
    bool broken = false;
  };

  std::unique_ptr<pqxx::connection> Acquire();
  void Release(std::unique_ptr<pqxx::connection> connection, bool broken);

  const std::string conninfo_;
  const std::size_t size_;
  const std::function<void(pqxx::connection&)> prepare_;
  std::mutex mutex_;
  std::condition_variable released_;
  std::vector<std::unique_ptr<pqxx::connection>> idle_;
  std::size_t leased_ = 0;
};

}  // namespace billguard::proxy
