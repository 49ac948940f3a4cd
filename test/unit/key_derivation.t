# Runs the C++ unit test binary (built by `make unit`) under prove.
exec('test/unit/key_derivation_test') or die "cannot run test/unit/key_derivation_test: $!";
