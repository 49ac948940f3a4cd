# ALTER EXTENSION billguard UPDATE from 0.1.0 keeps the grants operators hold
# on billguard.dispatch_status and dispatcher_state(): the update gives
# dispatcher_state() new columns, so it creates the function anew, carries
# the EXECUTE grants of the old one over and re-points the view rather than
# dropping it. An operator who could watch the dispatcher before the update
# still can after it, and pg_dump carries the grants (they are the users',
# not the extension's initial privileges).
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use BillguardNode;

my $node = BillguardNode->preloaded('update_grants', { extension_version => '0.1.0' });
$node->safe_psql('postgres', q{
	CREATE ROLE billing_ops LOGIN;
	GRANT USAGE ON SCHEMA billguard TO billing_ops;
	GRANT SELECT ON billguard.dispatch_status TO billing_ops;
	GRANT EXECUTE ON FUNCTION billguard.dispatcher_state() TO billing_ops;
});
is($node->safe_psql('postgres', 'SELECT count(*) FROM billguard.dispatch_status', extra_params => [ '-U', 'billing_ops' ]),
	'1', '0.1.0: billing_ops reads dispatch_status');
$node->safe_psql('postgres', 'ALTER EXTENSION billguard UPDATE');
is($node->safe_psql('postgres', "SELECT has_table_privilege('billing_ops', 'billguard.dispatch_status', 'SELECT')"), 't',
	'after the update billing_ops still holds SELECT on dispatch_status');
is($node->safe_psql('postgres', "SELECT has_function_privilege('billing_ops', 'billguard.dispatcher_state()', 'EXECUTE')"), 't',
	'and EXECUTE on the new dispatcher_state()');
is($node->safe_psql('postgres', 'SELECT count(*) FROM billguard.dispatch_status', extra_params => [ '-U', 'billing_ops' ]),
	'1', 'so billing_ops reads dispatch_status, with no grant given again');
my ($dump) = run_command([ 'pg_dump', '--schema-only', '-d', $node->connstr('postgres') ]);
like($dump, qr/^GRANT ALL ON FUNCTION billguard\.dispatcher_state\(.*\) TO billing_ops;$/m,
	'pg_dump carries the grant on dispatcher_state(): it is the user\'s');

$node->stop;
done_testing();
