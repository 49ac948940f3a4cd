// A small pool of libpqxx connections shared by the proxy's threads. One
// connection per call at a time. A pooled connection is checked before it
// is used: one the server closed while it was idle (a restart, an
// administrator's pg_terminate_backend) has the server's goodbye waiting
// on its socket, and is replaced by a new one before anything is sent on
// it, so a database restart costs no request an error. A call whose
// connection breaks while it runs is retried once on a new connection
// when the caller says a repeat of it is harmless.
#pragma once

#include "pqxx_compat.hpp"

#include <atomic>
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

// Whether a call may run a second time after its connection broke under
// it. The statement may have committed before the break: only a call whose
// repeat changes nothing more (or only what its first run would) says
// kOnce.
enum class Retry { kNever, kOnce };

class DatabasePool {
 public:
  // `prepare` runs on every new connection (prepared statements);
  // `replaced`, when given, counts the connections found broken.
  DatabasePool(std::string conninfo, std::size_t size,
               std::function<void(pqxx::connection&)> prepare,
               std::atomic<unsigned long long>* replaced = nullptr,
               std::atomic<unsigned long long>* retried = nullptr);

  // Whether a connection has the prepared statements. The startup diagnosis
  // runs without: libpqxx 7 prepares when a connection is set up (6.4 at
  // first use), which fails on a database that lacks what they call, before
  // the diagnosis could say what is missing.
  enum class Statements { kPrepared, kNone };

  // Runs fn on a connection. Throws DatabaseUnavailable when no connection
  // can be had or it broke during fn (after the one retry `retry` allows);
  // pqxx::sql_error passes through. A connection without statements is
  // opened for fn and closed after it.
  template <typename Fn>
  auto Run(Fn&& fn, Retry retry = Retry::kNever, Statements statements = Statements::kPrepared)
      -> decltype(fn(std::declval<pqxx::connection&>())) {
    for (int run = 0;; ++run) {
      Lease lease(*this, statements);
      try {
        return fn(*lease.connection);
      } catch (const pqxx::broken_connection& e) {
        lease.broken = true;
        if (retry == Retry::kNever || run > 0) throw DatabaseUnavailable(e.what());
      } catch (const pqxx::sql_error& e) {
        // The server ending our session (shutdown, restart) or refusing it.
        const std::string state = pqxx_compat::SqlState(e);
        if (state.rfind("08", 0) != 0 && state.rfind("57P", 0) != 0 &&
            lease.connection->is_open()) {
          throw;
        }
        lease.broken = true;
        if (retry == Retry::kNever || run > 0) throw DatabaseUnavailable(e.what());
      }
      if (retried_ != nullptr) ++*retried_;
    }
  }

  // Run without the prepared statements, on a connection opened for fn.
  template <typename Fn>
  auto RunUnprepared(Fn&& fn) -> decltype(fn(std::declval<pqxx::connection&>())) {
    return Run(std::forward<Fn>(fn), Retry::kNever, Statements::kNone);
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
  std::unique_ptr<pqxx::connection> Open(Statements statements);
  void Release(std::unique_ptr<pqxx::connection> connection, bool broken);

  const std::string conninfo_;
  const std::size_t size_;
  const std::function<void(pqxx::connection&)> prepare_;
  std::atomic<unsigned long long>* const replaced_;
  std::atomic<unsigned long long>* const retried_;
  std::mutex mutex_;
  std::condition_variable released_;
  std::vector<std::unique_ptr<pqxx::connection>> idle_;
  std::size_t leased_ = 0;
};

}  // namespace billguard::proxy
