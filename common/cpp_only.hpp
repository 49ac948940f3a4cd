// Included first by every file of common/: the pure C++ that the extension,
// the proxy and the unit tests share. PostgreSQL's headers redefine printf,
// snprintf, gettext and friends and bring longjmp-based errors; code built
// beside them is not pure. A file of common/ that is compiled after a
// PostgreSQL header fails here, so include common/ headers first.
//
// Deliberately no include guard: the check runs at every inclusion.
#if defined(POSTGRES_H) || defined(POSTGRES_FE_H) || defined(C_H) || defined(PG_CONFIG_H)
#error "common/ is pure C++: include its headers before any PostgreSQL header"
#endif
