// A small pool of libpqxx connections shared by the proxy's threads. One
// connection per call at a time; a connection that broke is dropped and a
// new one opened by the next call, so the proxy reconnects by itself after
// a database restart.
#pragma once

#include "pqxx_compat.hpp"

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

  // Whether a connection has the prepared statements. The startup diagnosis
  // runs without: libpqxx 7 prepares when a connection is set up (6.4 at
  // first use), which fails on a database that lacks what they call, before
  // the diagnosis could say what is missing.
  enum class Statements { kPrepared, kNone };

  // Runs fn on a connection. Throws DatabaseUnavailable when no connection
  // can be had or it broke during fn; pqxx::sql_error passes through. A
  // connection without statements is opened for fn and closed after it.
  template <typename Fn>
  auto Run(Fn&& fn, Statements statements = Statements::kPrepared)
      -> decltype(fn(std::declval<pqxx::connection&>())) {
    Lease lease(*this, statements);
    try {
      return fn(*lease.connection);
    } catch (const pqxx::broken_connection& e) {
      lease.broken = true;
      throw DatabaseUnavailable(e.what());
    } catch (const pqxx::sql_error& e) {
      // The server ending our session (shutdown, restart) or refusing it.
      const std::string state = pqxx_compat::SqlState(e);
      if (state.rfind("08", 0) == 0 || state.rfind("57P", 0) == 0 || !lease.connection->is_open()) {
        lease.broken = true;
        throw DatabaseUnavailable(e.what());
      }
      throw;
    }
  }

  // Run without the prepared statements, on a connection opened for fn.
  template <typename Fn>
  auto RunUnprepared(Fn&& fn) -> decltype(fn(std::declval<pqxx::connection&>())) {
    return Run(std::forward<Fn>(fn), Statements::kNone);
  }

 private:
  struct Lease {
    Lease(DatabasePool& pool, Statements statements);
    ~Lease();
    DatabasePool& pool;
    const Statements statements;
    std::unique_ptr<pqxx::connection> connection;
    bool broken = false;
  };

  std::unique_ptr<pqxx::connection> Acquire(Statements statements);
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
