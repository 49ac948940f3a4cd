# Failover with asynchronous streaming replication in the middle of a period:
# see test/lib/FailoverScenario.pm.
use strict;
use warnings;
use Test::More;
use FailoverScenario;

run_failover('async');
done_testing();
