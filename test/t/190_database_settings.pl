# One user's setting must not stop billing: what the database's owner sets
# with ALTER DATABASE ... SET is not what the dispatcher runs with.
#
#   planner    enable_indexscan = off for the database: the dispatcher plans
#              with the server's value, logs that it ignores the setting,
#              and 400 records settle as fast as without it (before: 30-55
#              times slower, with no line saying why)
#   role       role = 'dbowner' (with a statement_timeout and SERIALIZABLE
#              besides): the dispatcher runs as itself and bills (before:
#              every start failed with "permission denied for schema
#              billguard", 0 charges)
#   read-only  default_transaction_read_only = on for the database: the
#              dispatcher waits, and once ALTER DATABASE ... RESET and a
#              reload lift it, the same dispatcher bills (before: it waited
#              for ever, having read the setting only when it connected)
#   a failure  a start that fails is reported by dispatch_status with its
#              error (before: "no dispatcher runs yet: the launcher starts
#              one"), and once the cause is gone the next start bills
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep time);
use BillguardTest;
use BillguardNode;

my $emulator = start_emulator();
my $node = BillguardNode->dispatching('database_settings', $emulator, "billguard.database = 'billing'");
# The test's own sessions override what ALTER DATABASE sets for billing.
$ENV{PGOPTIONS} = '-c role=none -c enable_indexscan=on -c statement_timeout=0 -c default_transaction_read_only=off'
  . ' -c default_transaction_isolation=read\ committed';

sub qb { my ($sql) = @_; return $node->safe_psql('billing', $sql) }
sub as_owner { my ($sql) = @_; return $node->safe_psql('postgres', $sql, extra_params => [ '-U', 'dbowner' ]) }
sub dispatcher { return qb(q{SELECT coalesce(worker_pid, 0) FROM billguard.dispatch_status}) }
sub restart_dispatcher {
	my $old = dispatcher();
	kill('TERM', $old) if $old;
	return wait_until('a new dispatcher', 30, sub { my $pid = dispatcher(); $pid && $pid != $old });
}
sub log_after { my ($offset) = @_; return substr(slurp_file($node->logfile), $offset) }

$node->safe_psql('postgres', 'CREATE ROLE dbowner LOGIN; CREATE DATABASE billing OWNER dbowner');
qb('CREATE EXTENSION billguard');
qb(q{INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method)
	SELECT 'cust_' || g, 'cus_' || g, 1000 + g, 'usd', 'pm_card_visa' FROM generate_series(1, 400) g});
# A history to plan against: what earlier periods left.
qb(q{DO $$BEGIN FOR p IN 1..10 LOOP PERFORM billguard.bill_period('2030-' || lpad(p::text, 2, '0')); END LOOP; END$$});
ok(wait_until('the history to settle', 120, sub {
	qb(q{SELECT count(*) FROM billguard.billing_records WHERE status <> 'completed'}) eq '0' }),
	'4,000 records of earlier periods settle');

# Seconds until every record of $period is completed, once billed.
sub seconds_to_bill {
	my ($period, $timeout) = @_;
	my $start = time;
	is(qb("SELECT initiated FROM billguard.bill_period('$period')"), '400', "$period: 400 records claimed");
	my $settled = wait_until("$period settled", $timeout, sub {
		qb("SELECT count(*) FROM billguard.billing_records WHERE billing_period = '$period' AND status <> 'completed'") eq '0' });
	return $settled ? time - $start : undef;
}

# ---- planner ------------------------------------------------------------------------

my $baseline = seconds_to_bill('2031-01', 60);
ok(defined $baseline, sprintf('without database settings 400 records settle in %.1f s', $baseline // -1));
my $offset = -s $node->logfile;
as_owner(q{ALTER DATABASE billing SET enable_indexscan = off});
ok(restart_dispatcher(), 'planner: a dispatcher connects with enable_indexscan = off set for the database');
my $slowed = seconds_to_bill('2031-02', 30);
ok(defined $slowed && $slowed < 3 * $baseline + 2,
	sprintf('planner: 400 records settle in %.1f s, as without the setting (%.1f s)', $slowed // -1, $baseline));
like(log_after($offset), qr/billguard dispatcher: ignores enable_indexscan = 'off', set for this database or its role \(ALTER DATABASE or ALTER ROLE \.\.\. SET\): it runs with 'on'/,
	'planner: the log says it ignores the setting, and what it runs with');

# ---- role ----------------------------------------------------------------------------

$offset = -s $node->logfile;
as_owner(q{ALTER DATABASE billing SET role = 'dbowner'});
as_owner(q{ALTER DATABASE billing SET statement_timeout = '1ms'});
as_owner(q{ALTER DATABASE billing SET default_transaction_isolation = serializable});
ok(restart_dispatcher(), 'role: a dispatcher connects with role = dbowner set for the database');
ok(defined seconds_to_bill('2031-03', 60), 'role: 400 records are charged all the same');
my $by_key = charges_by_key($emulator);
my @wrong = grep { my ($key, $charge) = split /\|/; !(@{ $by_key->{$key} // [] } == 1 && $by_key->{$key}[0] eq $charge) }
  split /\n/, qb(q{SELECT idempotency_key || '|' || charge_id FROM billguard.billing_records WHERE billing_period = '2031-03'});
is(scalar(@wrong), 0, 'role: each with the one charge the emulator holds for its key');
unlike(log_after($offset), qr/permission denied for schema billguard/, 'role: no start failed');
like(log_after($offset), qr/ignores role = 'dbowner'/, 'role: the log says it ignores the role');
is(qb('SELECT worker_running FROM billguard.dispatch_status'), 't', 'role: dispatch_status shows it running');
as_owner('ALTER DATABASE billing RESET ALL');

# ---- read-only ------------------------------------------------------------------------

as_owner(q{ALTER DATABASE billing SET default_transaction_read_only = on});
ok(restart_dispatcher(), 'read-only: a dispatcher connects to the database made read-only');
ok(wait_until('the dispatcher to wait', 30, sub {
	qb(q{SELECT paused AND pause_reason LIKE 'this database is read-only%' FROM billguard.dispatch_status}) eq 't' }),
	'read-only: it waits, and dispatch_status says why');
my $waiting = dispatcher();
is(qb("SELECT initiated FROM billguard.bill_period('2031-04')"), '400', 'read-only: 2031-04 claimed by a session');
sleep 1;
is(qb(q{SELECT count(*) FROM billguard.billing_records WHERE billing_period = '2031-04' AND status <> 'pending'}),
	'0', 'read-only: nothing of it is sent');
as_owner(q{ALTER DATABASE billing RESET default_transaction_read_only});
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
ok(wait_until('2031-04 settled', 60, sub {
	qb(q{SELECT count(*) FROM billguard.billing_records WHERE billing_period = '2031-04' AND status <> 'completed'}) eq '0' }),
	'read-only: lifted with ALTER DATABASE ... RESET and a reload, the records are charged');
is(dispatcher(), $waiting, 'read-only: by the dispatcher that waited');

# ---- a start that fails -------------------------------------------------------------

qb('ALTER FUNCTION billguard.requeue_abandoned() RENAME TO requeue_abandoned_elsewhere');
my $old = dispatcher();
kill('TERM', $old);
my $reason = '';
ok(wait_until('dispatch_status to report the failure', 30, sub {
	$reason = qb(q{SELECT coalesce(not_served_reason, '') FROM billguard.dispatch_status});
	$reason =~ /function billguard\.requeue_abandoned\(\) does not exist/ }),
	'a failure: dispatch_status reports the error that ends every start');
like($reason, qr/^the dispatcher failed at its start or in its loop \(\d+ times in a row, the last at .*\): .*; the launcher starts it again every 2 s$/,
	'a failure: and that the launcher keeps trying');
qb('ALTER FUNCTION billguard.requeue_abandoned_elsewhere() RENAME TO requeue_abandoned');
ok(wait_until('a dispatcher to run again', 30, sub {
	qb(q{SELECT worker_running AND not_served_reason IS NULL FROM billguard.dispatch_status}) eq 't' }),
	'a failure: once the cause is gone, a dispatcher runs and nothing is reported');
ok(defined seconds_to_bill('2031-05', 60), 'a failure: and bills');

$node->stop;
$emulator->stop;
done_testing();

