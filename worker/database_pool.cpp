// The connection pool (see database_pool.hpp).
#include "database_pool.hpp"

namespace billguard::proxy {

namespace {

// How long a call waits for a free connection before answering 503.
constexpr auto kAcquireTimeout = std::chrono::seconds(10);

}  // namespace

DatabasePool::DatabasePool(std::string conninfo, std::size_t size,
                           std::function<void(pqxx::connection&)> prepare)
    : conninfo_(std::move(conninfo)), size_(size), prepare_(std::move(prepare)) {}

DatabasePool::Lease::Lease(DatabasePool& p, Statements s)
    : pool(p), statements(s), connection(p.Acquire(s)) {}

DatabasePool::Lease::~Lease() {
  pool.Release(std::move(connection), broken || statements == Statements::kNone);
}

std::unique_ptr<pqxx::connection> DatabasePool::Acquire(Statements statements) {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!released_.wait_for(lock, kAcquireTimeout, [&] { return leased_ < size_; })) {
      throw DatabaseUnavailable("every database connection is busy");
    }
    ++leased_;
    if (statements == Statements::kPrepared && !idle_.empty()) {
      auto connection = std::move(idle_.back());
      idle_.pop_back();
      return connection;
    }
  }
  // A new connection, opened outside the lock.
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
