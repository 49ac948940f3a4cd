// Implementation of the C++/PostgreSQL error boundary (see pg_boundary.hpp).
#include "postgres/pg_boundary.hpp"

#include <cstring>
#include <new>

extern "C" {
#include "utils/memutils.h"
}

namespace billguard {

void ThrowCaughtPostgresError(const ErrorStacks& stacks, MemoryContext caller_context) {
  // An error while copying must reach the caller's handler, not this one.
  stacks.Restore();
  // CopyErrorData must not run in ErrorContext, which FlushErrorState resets.
  MemoryContextSwitchTo(caller_context);
  ErrorData* volatile data = nullptr;
  // CopyErrorData allocates and may itself fail (out of memory): guarded, so
  // that failure also becomes a C++ exception and C++ frames still unwind.
  PG_TRY();
  { data = CopyErrorData(); }
  PG_CATCH();
  {
    MemoryContextSwitchTo(caller_context);
    data = nullptr;
  }
  PG_END_TRY();
  FlushErrorState();
  if (data == nullptr) throw std::bad_alloc();
  throw PostgresError(data);
}

namespace {

void CopyMessage(EscapedError& escaped, const char* message) noexcept {
  std::strncpy(escaped.message, message, sizeof(escaped.message) - 1);
  escaped.message[sizeof(escaped.message) - 1] = '\0';
}

}  // namespace

// Called only from inside a catch block: classifies the active exception
// without allocating through PostgreSQL (an ereport here would longjmp out of
// the catch block and leak the exception object).
void RecordException(EscapedError& escaped) noexcept {
  try {
    throw;
  } catch (const PostgresError& e) {
    escaped.postgres = e.data();
  } catch (const InvalidParameter& e) {
    escaped.sqlstate = ERRCODE_INVALID_PARAMETER_VALUE;
    CopyMessage(escaped, e.what());
  } catch (const std::bad_alloc&) {
    escaped.sqlstate = ERRCODE_OUT_OF_MEMORY;
    CopyMessage(escaped, "out of memory");
  } catch (const std::exception& e) {
    escaped.sqlstate = ERRCODE_INTERNAL_ERROR;
    CopyMessage(escaped, e.what());
  } catch (...) {
    escaped.sqlstate = ERRCODE_INTERNAL_ERROR;
    CopyMessage(escaped, "unknown C++ exception");
  }
}

void RaiseEscapedError(const char* function_name, EscapedError& escaped) {
  if (escaped.postgres != nullptr) ReThrowError(escaped.postgres);
  if (escaped.sqlstate == ERRCODE_INTERNAL_ERROR) {
    ereport(ERROR, (errcode(escaped.sqlstate), errmsg("%s", escaped.message),
                    errcontext("C++ code of %s", function_name)));
  }
  ereport(ERROR, (errcode(escaped.sqlstate), errmsg("%s", escaped.message)));
  pg_unreachable();
}

}  // namespace billguard
