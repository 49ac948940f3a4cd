// The connection pool (see database_pool.hpp).
#include "database_pool.hpp"

#include <poll.h>

namespace billguard::proxy {

namespace {

// How long a call waits for a free connection before answering 503.
constexpr auto kAcquireTimeout = std::chrono::seconds(10);

// An idle connection has nothing to read: no query is outstanding and the
// proxy listens for no notification. Anything waiting on its socket is the
// server's goodbye (the FATAL of a shutdown or a terminated backend, then
// end of file), so it must not carry the next call.
bool StillOpen(pqxx::connection& connection) {
  if (!connection.is_open()) return false;
  const int socket = connection.sock();
  if (socket < 0) return false;
  pollfd waiting{socket, POLLIN, 0};
  const int ready = ::poll(&waiting, 1, 0);
  return ready == 0;
}

}  // namespace

DatabasePool::DatabasePool(std::string conninfo, std::size_t size,
                           std::function<void(pqxx::connection&)> prepare,
                           std::atomic<unsigned long long>* replaced,
                           std::atomic<unsigned long long>* retried)
    : conninfo_(std::move(conninfo)),
      size_(size),
      prepare_(std::move(prepare)),
      replaced_(replaced),
      retried_(retried) {}

DatabasePool::Lease::Lease(DatabasePool& p, Statements s)
    : pool(p), statements(s), connection(p.Acquire(s)) {}

DatabasePool::Lease::~Lease() {
  pool.Release(std::move(connection), broken || statements == Statements::kNone);
}

std::unique_ptr<pqxx::connection> DatabasePool::Acquire(Statements statements) {
  std::unique_ptr<pqxx::connection> connection;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!released_.wait_for(lock, kAcquireTimeout, [&] { return leased_ < size_; })) {
      throw DatabaseUnavailable("every database connection is busy");
    }
    ++leased_;
    if (statements == Statements::kPrepared && !idle_.empty()) {
      connection = std::move(idle_.back());
      idle_.pop_back();
    }
  }
  // Checked, and a new one opened, outside the lock.
  if (connection && StillOpen(*connection)) return connection;
  if (connection && replaced_ != nullptr) ++*replaced_;
  connection.reset();
  return Open(statements);
}

std::unique_ptr<pqxx::connection> DatabasePool::Open(Statements statements) {
  try {
    auto connection = std::make_unique<pqxx::connection>(conninfo_);
    if (statements == Statements::kPrepared) prepare_(*connection);
    return connection;
  } catch (const std::exception& e) {
    Release(nullptr, true);
    throw DatabaseUnavailable(e.what());
  }
}

void DatabasePool::Release(std::unique_ptr<pqxx::connection> connection, bool broken) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    --leased_;
    if (connection && !broken && connection->is_open()) idle_.push_back(std::move(connection));
  }
  released_.notify_one();
}

}  // namespace billguard::proxy
