// The one boundary between C++ and PostgreSQL error handling.
//
// PostgreSQL reports errors with siglongjmp; C++ needs stack unwinding so
// destructors run. Two guards keep them apart, and every SQL-callable
// function and worker entry point of billguard goes through them:
//
//   GuardedCall(body)      C++ -> PostgreSQL direction. Runs a C++ body for
//                          an extern "C" function; any C++ exception is turned
//                          into ereport(ERROR) only after every C++ frame of
//                          the body has been unwound.
//   CallPostgres(fn)       PostgreSQL -> C++ direction. Runs a PostgreSQL call
//                          that may ereport(ERROR) while C++ objects are alive;
//                          the error is caught with our own sigsetjmp and
//                          rethrown as a C++ PostgresError, so destructors run.
//
// Pure C++ code (no PostgreSQL headers) throws billguard::InvalidParameter
// for bad input; GuardedCall maps it to SQLSTATE 22023.
#pragma once

#include "common/errors.hpp"

extern "C" {
#include "postgres.h"
#include "fmgr.h"
#include "utils/elog.h"
}

#include <exception>
#include <type_traits>

namespace billguard {

// A PostgreSQL error caught by CallPostgres, carried through C++ frames.
class PostgresError : public std::exception {
 public:
  explicit PostgresError(ErrorData* data) : data_(data) {}
  const char* what() const noexcept override { return data_->message ? data_->message : "error"; }
  ErrorData* data() const { return data_; }

 private:
  ErrorData* data_;  // palloc'd in the caller's memory context
};

// PostgreSQL's error stacks as they were when a CallPostgres began; restored
// however that scope ends (normal return, a caught ERROR, a C++ exception), so
// PG_exception_stack never points into a frame that is gone.
class ErrorStacks {
 public:
  ErrorStacks() : exception_stack_(PG_exception_stack), context_stack_(error_context_stack) {}
  ~ErrorStacks() { Restore(); }
  ErrorStacks(const ErrorStacks&) = delete;
  ErrorStacks& operator=(const ErrorStacks&) = delete;
  void Restore() const {
    PG_exception_stack = exception_stack_;
    error_context_stack = context_stack_;
  }

 private:
  sigjmp_buf* exception_stack_;
  ErrorContextCallback* context_stack_;
};

// Turns the ERROR that longjmp'd to a CallPostgres into a PostgresError:
// restores the stacks, copies the error into caller_context and throws.
// Implemented in pg_boundary.cpp, the one place that copies error data.
[[noreturn]] void ThrowCaughtPostgresError(const ErrorStacks& stacks, MemoryContext caller_context);

// Runs `fn` (which must itself hold no C++ objects with destructors) and
// turns a PostgreSQL ERROR inside it into a PostgresError exception.
template <typename Fn>
auto CallPostgres(Fn&& fn) -> decltype(fn()) {
  const ErrorStacks stacks;
  MemoryContext caller_context = CurrentMemoryContext;
  sigjmp_buf local_jump;
  if (sigsetjmp(local_jump, 0) != 0) ThrowCaughtPostgresError(stacks, caller_context);
  PG_exception_stack = &local_jump;
  return fn();
}

// Why an exception escaped a guarded body, decided inside the catch blocks
// and reported only after they have closed.
struct EscapedError {
  int sqlstate = 0;
  ErrorData* postgres = nullptr;
  char message[1024] = {0};
};

void RecordException(EscapedError& escaped) noexcept;
[[noreturn]] void RaiseEscapedError(const char* function_name, EscapedError& escaped);

// Runs a C++ body on behalf of PostgreSQL. No C++ exception leaves it: the
// error is raised with ereport(ERROR) from this frame, after the body's
// frames are gone.
template <typename Body>
Datum GuardedCall(const char* function_name, Body&& body) noexcept {
  EscapedError escaped;
  try {
    return body();
  } catch (...) {
    RecordException(escaped);
  }
  RaiseEscapedError(function_name, escaped);
}

}  // namespace billguard
