# Runs the C++ unit test binary (built by `make unit`) under prove.
exec('test/unit/dispatch_units_test') or die "cannot run test/unit/dispatch_units_test: $!";
