# A database no dispatcher serves says so in dispatch_status, and why,
# instead of looking healthy while its billings stay pending:
#   - billguard.database restricts service to postgres: in database other
#     (with the extension) no dispatcher ever connects, and its
#     dispatch_status names the setting; postgres is served; unset and
#     reloaded, other is served, set again, its dispatcher leaves;
#   - no background worker slot: with max_worker_processes = 2 the launcher
#     and one dispatcher fit, so of two databases with the extension one is
#     served and the other's dispatch_status and the server log say that no
#     worker slot is free; with 3 slots and a restart both are served;
#   - billguard not preloaded: dispatch_status says so.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);
use BillguardTest;
use BillguardNode;

my $emulator = start_emulator();

# ---- billguard.database names another database -------------------------------------

my $restricted = BillguardNode->dispatching('restricted', $emulator);    # billguard.database = 'postgres'
$restricted->safe_psql('postgres', 'CREATE DATABASE other');
$restricted->safe_psql('other', 'CREATE EXTENSION billguard');
is($restricted->safe_psql('other',
	"SELECT worker_running || '|' || not_served_reason FROM billguard.dispatch_status"),
	'false|this database is not served: billguard.database is "postgres": only that database is served',
	'other: dispatch_status says it is not served, because billguard.database names postgres');
ok(wait_until('the dispatcher of postgres', 30, sub {
	$restricted->safe_psql('postgres', 'SELECT worker_running FROM billguard.dispatch_status') eq 't' }),
	'postgres is served');
sleep 0.5;    # a launcher that served other would have started its dispatcher by now
is($restricted->safe_psql('postgres', q{
	SELECT count(*) FROM pg_stat_activity WHERE datname = 'other' AND backend_type = 'billguard dispatcher'}), '0',
	'no dispatcher connects to other');

# The restriction is reloadable: lifted, other is served; set again, its dispatcher leaves.
$restricted->reload_with(database => '');
ok(wait_until('other served', 30, sub {
	$restricted->safe_psql('other', 'SELECT worker_running FROM billguard.dispatch_status') eq 't' }),
	'billguard.database unset and reloaded: other is served, without a restart');
$restricted->reload_with(database => 'postgres');
ok(wait_until('other left', 30, sub {
	$restricted->safe_psql('postgres', q{
		SELECT count(*) FROM pg_stat_activity WHERE datname = 'other' AND backend_type = 'billguard dispatcher'}) eq '0' }),
	'billguard.database = postgres again: the dispatcher of other leaves');
like($restricted->safe_psql('other', 'SELECT not_served_reason FROM billguard.dispatch_status'),
	qr/billguard.database is "postgres"/, 'and other says why it is not served');
is($restricted->safe_psql('postgres', 'SELECT worker_running FROM billguard.dispatch_status'), 't',
	'postgres is still served');
$restricted->stop;

# ---- no background worker slot ------------------------------------------------------

my $small = BillguardNode->dispatching('no_slot', $emulator,
	"billguard.database = ''",
	'max_worker_processes = 2',    # the launcher and one dispatcher
	'max_logical_replication_workers = 0',
	'max_parallel_workers_per_gather = 0');
$small->safe_psql('postgres', 'CREATE DATABASE second');
$small->safe_psql('second', 'CREATE EXTENSION billguard');
$small->restart;

# database => dispatch_status of it as "running|reason".
sub status_by_database {
	my ($node) = @_;
	return { map { ($_ => $node->safe_psql($_,
		"SELECT worker_running || '|' || coalesce(not_served_reason, '') FROM billguard.dispatch_status")) }
		qw(postgres second) };
}
my $status;
ok(wait_until('one database served, the other out of slots', 30, sub {
	$status = status_by_database($small);
	my @running = grep { $status->{$_} eq 'true|' } keys %$status;
	my @waiting = grep { $status->{$_} =~ /^false\|no background worker slot is free/ } keys %$status;
	return @running == 1 && @waiting == 1;
}), 'with one slot for a dispatcher, one database is served and the other waits for a slot');
diag(explain($status)) unless grep { $_ =~ /slot/ } values %$status;
my ($unserved) = grep { $status->{$_} =~ /slot/ } keys %$status;
like($status->{$unserved}, qr/billguard needs one for its launcher and one per database it serves \(max_worker_processes = 2\)/,
	'its dispatch_status says how many slots billguard needs');
like(slurp_file($small->logfile), qr/WARNING:  billguard launcher: no background worker slot is free for a dispatcher in database "$unserved".*raise max_worker_processes \(now 2\)/,
	'the server log says which database cannot be served and what to do');

$small->append_conf('postgresql.conf', 'max_worker_processes = 3');
$small->restart;
ok(wait_until('both databases served', 30, sub {
	$status = status_by_database($small);
	return $status->{postgres} eq 'true|' && $status->{second} eq 'true|';
}), 'with a slot more, both databases are served');
$small->stop;

# ---- not preloaded --------------------------------------------------------------------

my $plain = BillguardNode->new('not_preloaded');
$plain->init;
$plain->start;
$plain->safe_psql('postgres', 'CREATE EXTENSION billguard');
is($plain->safe_psql('postgres', "SELECT worker_running || '|' || not_served_reason FROM billguard.dispatch_status"),
	'false|billguard is not in shared_preload_libraries: no dispatcher runs on this server',
	'without preloading, dispatch_status says that no dispatcher runs');
$plain->stop;

$emulator->stop;
done_testing();
