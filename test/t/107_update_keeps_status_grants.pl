# ALTER EXTENSION billguard UPDATE from 0.1.0 keeps the grants operators hold
# on billguard.dispatch_status: the update gives dispatcher_state() new
# columns and re-points the view rather than dropping it (issue 6, items 18
# and 20). With the 0.2.0 README's EXECUTE on dispatcher_state(), the
# operator reads the view.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use BillguardTest;

my $node = billguard_node('update_grants', { extension_version => '0.1.0' });
$node->safe_psql('postgres', q{
	CREATE ROLE billing_ops LOGIN;
	GRANT USAGE ON SCHEMA billguard TO billing_ops;
	GRANT SELECT ON billguard.dispatch_status TO billing_ops;
});
$node->safe_psql('postgres', 'ALTER EXTENSION billguard UPDATE');
is($node->safe_psql('postgres', "SELECT has_table_privilege('billing_ops', 'billguard.dispatch_status', 'SELECT')"), 't',
	'after the update billing_ops still holds SELECT on dispatch_status');
$node->safe_psql('postgres', 'GRANT EXECUTE ON FUNCTION billguard.dispatcher_state() TO billing_ops');
is($node->safe_psql('postgres', 'SELECT count(*) FROM billguard.dispatch_status', extra_params => [ '-U', 'billing_ops' ]),
	'1', 'with EXECUTE on dispatcher_state(), as the README says, billing_ops reads dispatch_status');

$node->stop;
done_testing();
