# A pg_upgrade'd cluster is the same database: it bills on without a
# person, though its system identifier is new (pg_upgrade keeps database
# OIDs, and billguard.installation with the data). A copy that was never
# adopted is still a copy afterwards.
#   - old cluster: billing bills 2031-01; copy is a template copy of it;
#   - pg_upgrade to a new cluster (the same major: what matters is what
#     pg_upgrade does to OIDs, the system identifier and the data);
#   - new cluster: billing's dispatcher runs unpaused and bills 2031-02, one
#     charge per record; copy still waits to be adopted.
use strict;
use warnings;
use Cwd qw(getcwd);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use BillguardTest;
use BillguardNode;

my $emulator = start_emulator();
my $old = BillguardNode->dispatching('upgrade_old', $emulator, "billguard.database = ''");
sub qd { my ($node, $database, $sql) = @_; return $node->safe_psql($database, $sql) }
sub settled {
	my ($node, $period) = @_;
	return wait_until("billing $period settled", 60, sub {
		qd($node, 'billing', "SELECT count(*) || '/' || count(*) FILTER (WHERE status = 'completed')"
			. " FROM billguard.billing_records WHERE billing_period = '$period'") eq '20/20' });
}

qd($old, 'postgres', 'CREATE DATABASE billing');
qd($old, 'billing', 'CREATE EXTENSION billguard');
qd($old, 'billing', q{INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method)
	SELECT 'cust_' || g, 'cus_' || g, 1000 + g, 'usd', 'pm_card_visa' FROM generate_series(1, 20) g});
is(qd($old, 'billing', "SELECT initiated FROM billguard.bill_period('2031-01')"), '20', 'old: 2031-01 claimed');
ok(settled($old, '2031-01'), 'old: and charged');
qd($old, 'postgres', 'CREATE DATABASE copy TEMPLATE billing');
my $oid = qd($old, 'postgres', q{SELECT oid FROM pg_database WHERE datname = 'billing'});
my $system = qd($old, 'postgres', 'SELECT system_identifier FROM pg_control_system()');
$old->stop;

my $new = BillguardNode->new('upgrade_new');
$new->init;
my $key_file = $new->set_api_key($StripeEmulatorHarness::DEFAULT_API_KEY);
$new->append_conf('postgresql.conf', join("\n",
	"shared_preload_libraries = 'billguard'", 'fsync = off', "billguard.database = ''",
	"billguard.api_base = '" . $emulator->url('') . "'", "billguard.api_key_file = '$key_file'",
	'billguard.max_requests_per_second = 2000', "billguard.poll_interval = '200ms'"));
my $bindir = $old->config_data('--bindir');
my $cwd = getcwd();
chdir $new->basedir or die "cannot enter " . $new->basedir;
command_ok([ 'pg_upgrade', '--no-sync', '-d', $old->data_dir, '-D', $new->data_dir, '-b', $bindir, '-B', $bindir,
	'-s', $new->host, '-p', $old->port, '-P', $new->port ], 'pg_upgrade to a new cluster');
chdir $cwd;
$new->start;

isnt(qd($new, 'postgres', 'SELECT system_identifier FROM pg_control_system()'), $system,
	'new: the cluster has a system identifier of its own');
is(qd($new, 'postgres', q{SELECT oid FROM pg_database WHERE datname = 'billing'}), $oid, 'new: billing kept its OID');
ok(wait_until('billing served', 30, sub {
	qd($new, 'billing', 'SELECT worker_running AND NOT paused FROM billguard.dispatch_status') eq 't' }),
	'new: billing is served, not paused: the same database, no adoption needed');
is(qd($new, 'billing', 'SELECT billguard.billing_database_problem() IS NULL'), 't', 'new: it bills its history');
is(qd($new, 'billing', "SELECT initiated FROM billguard.bill_period('2031-02')"), '20', 'new: 2031-02 claimed');
ok(settled($new, '2031-02'), 'new: and charged');
my $by_key = charges_by_key($emulator);
is(scalar(grep { @{ $by_key->{$_} } != 1 } keys %$by_key), 0, 'new: one charge per key at the emulator');
is(scalar(keys %$by_key), 40, 'for the 40 records of both periods');
ok(wait_until('copy served', 30, sub {
	qd($new, 'copy', q{SELECT coalesce(pause_reason, '') FROM billguard.dispatch_status}) =~ /^this database is a copy of database billing / }),
	'new: copy still waits to be adopted');

$new->stop;
$emulator->stop;
done_testing();
