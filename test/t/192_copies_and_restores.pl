# A database whose billing history came from another database sends nothing
# and bills no period until an operator adopts it; the one it came from
# bills on. One node, every database served, the scheduler on:
#
#   restore    billing's history (1,000 accounts, two periods billed: some
#              6,000 journal events) is dumped, billing retired, and the dump
#              restored into a new database with psql, paused right after
#              its CREATE EXTENSION: no tick, no claim, no request while the
#              data is still coming (before: the new database's scheduler
#              billed the due period with 0 records, the journal's COPY then
#              failed on a duplicate key, an event was lost, and the period
#              was never billed), adopt_database() refused while the restore
#              runs; once it has finished every event is there, the status
#              says why nothing bills, and after adopt_database() the due
#              period is billed once per account.
#   pg_restore the same dump with pg_restore into a second database: it
#              waits too; adopted while the first bills with the same
#              billguard.key_namespace, it pauses, saying which database
#              bills with it (the namespace must be unique per Stripe
#              account).
#   copy       CREATE DATABASE ... TEMPLATE of the billing database, which
#              its dispatcher's connection no longer makes fail: a customer
#              deactivated in the original is not charged by the copy when
#              the next period is due (before: it was), the copy sends
#              nothing, and the original bills the period.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(sleep time);
use BillguardTest;
use BillguardNode;
use SchedulerScenario;

my $accounts = 1000;
my $emulator = start_emulator();
my $node = BillguardNode->dispatching('copies_and_restores', $emulator, "billguard.database = 'billing'");
$node->q1('DROP EXTENSION billguard');    # billing is the one database that bills

sub qd { my ($database, $sql) = @_; return $node->safe_psql($database, $sql) }
# Waits until $database holds $records records of $period, each completed.
sub settled {
	my ($database, $period, $records) = @_;
	return wait_until("$database $period settled", 60, sub {
		qd($database, "SELECT count(*) || '/' || count(*) FILTER (WHERE status = 'completed')"
			. " FROM billguard.billing_records WHERE billing_period = '$period'") eq "$records/$records" });
}
sub requests_for_database {
	my ($database) = @_;
	my %keys = map { ($_ => 1) } split /\n/, qd($database, 'SELECT idempotency_key FROM billguard.billing_records');
	return scalar grep { $keys{ $_->{metadata}{billguard_key} // '' } } @{ $emulator->ledger };
}

# ---- billing's history --------------------------------------------------------------

$node->q1('CREATE DATABASE billing');
qd('billing', 'CREATE EXTENSION billguard');
qd('billing', qq{INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method)
	SELECT 'cust_' || lpad(g::text, 4, '0'), 'cus_' || g, 1000 + g, 'usd', 'pm_card_visa' FROM generate_series(1, $accounts) g});
for my $period ('2031-06', '2031-07') {
	is(qd('billing', "SELECT initiated FROM billguard.bill_period('$period')"), $accounts, "billing: $period claimed");
	ok(settled('billing', $period, $accounts), "billing: $period charged");
}
my $events = qd('billing', 'SELECT count(*) FROM billguard.journal');
cmp_ok($events, '>=', 6000, "billing's journal holds $events events");
my $dump = $node->basedir . '/billing.dump';
my ($out, $err) = run_command([ 'pg_dump', '-Fc', '-f', $dump, '-d', $node->connstr('billing') ]);
is($err, '', 'pg_dump of billing');
my $script = $node->basedir . '/billing.sql';
($out, $err) = run_command([ 'pg_restore', '-f', $script, $dump ]);
is($err, '', 'and its SQL script');

# billing is retired; every other database is served, and 2031-08 is due.
$node->q1('ALTER DATABASE billing ALLOW_CONNECTIONS false');
my $offset = set_scheduler($node, database => '', auto_bill => 'monthly', scheduler_now => '2031-09-01 00:00:05+00');
my $sent_before = scalar @{ $emulator->ledger };

# ---- restore: psql, paused after its CREATE EXTENSION ------------------------------------

my $sql = slurp_file($script);
my $split = index($sql, "\nCOPY billguard.");
ok($split > 0 && index(substr($sql, 0, $split), 'CREATE EXTENSION IF NOT EXISTS billguard') >= 0,
	'the script creates the extension before its first COPY');
$node->q1('CREATE DATABASE restored');
my ($in, $psql_out, $psql_err) = (substr($sql, 0, $split + 1), '', '');
my $restore = IPC::Run::start([ 'psql', '-X', '-q', '-d', $node->connstr('restored') ],
	'<', \$in, '>', \$psql_out, '2>', \$psql_err);
ok(wait_until('the extension created by the restore', 30, sub {
	$restore->pump_nb; qd('restored', q{SELECT count(*) FROM pg_extension WHERE extname = 'billguard'}) eq '1' }),
	'restore: the script created the extension; its data is still to come');
ok(wait_until('the dispatcher of restored', 30, sub {
	qd('restored', q{SELECT worker_running AND paused FROM billguard.dispatch_status}) eq 't' }),
	'restore: a dispatcher serves the new database, paused');
like(qd('restored', 'SELECT pause_reason FROM billguard.dispatch_status'),
	qr/^this database was restored from a dump .*: it sends nothing and bills no period until an operator adopts it as the billing database \(SELECT billguard\.adopt_database\(\)\)$/,
	'restore: dispatch_status says it was restored and waits to be adopted');
sleep 2;    # the scheduler would have ticked by now
is(qd('restored', 'SELECT count(*) FROM billguard.journal'), '0', 'restore: no tick, no event while the data is coming');
my ($rc, $stdout, $stderr) = $node->psql('restored', 'SELECT billguard.adopt_database()');
like($stderr, qr/ERROR:  the restore into this database still runs \(pid \d+, [^)]+\)/,
	'restore: adopt_database() is refused while the restore runs');
$in .= substr($sql, $split + 1);
$restore->finish;
is($psql_err, '', 'restore: the rest of the script runs without an error');
is(qd('restored', 'SELECT count(*) FROM billguard.journal'), $events, "restore: all $events events arrived");
is(qd('restored', 'SELECT count(*) FROM billguard.billing_records'), 2 * $accounts, 'restore: and every record');
is(qd('restored', q{SELECT count(*) FROM billguard.billing_records WHERE billing_period = '2031-08'}), '0',
	'restore: 2031-08 is not billed');
like(qd('restored', 'SELECT pause_reason FROM billguard.scheduler_status'), qr/^this database was restored from a dump/,
	'restore: scheduler_status says why it bills nothing');
is(scalar @{ $emulator->ledger }, $sent_before, 'restore: no request reached the emulator');

# A session writing billguard's tables: a restore that still runs, as far as anyone can tell.
my ($writer_in, $writer_out) = ("BEGIN;\nUPDATE billguard.accounts SET amount_cents = amount_cents WHERE customer_id = 'cust_0001';\n"
	. "SELECT 'WRITING';\n", '');
my $writer = IPC::Run::start([ 'psql', '-XAtq', '-d', $node->connstr('restored') ], '<', \$writer_in, '>', \$writer_out);
wait_until('the writer', 20, sub { $writer->pump_nb; $writer_out =~ /WRITING/ });
($rc, $stdout, $stderr) = $node->psql('restored', 'SELECT billguard.adopt_database()');
like($stderr, qr/ERROR:  a session is writing billguard's tables/, 'restore: refused while a session writes its tables');
$writer_in .= "ROLLBACK;\n";
$writer->finish;

$offset = -s $node->logfile;
like(qd('restored', 'SELECT billguard.adopt_database()'), qr/^adopted/, 'restore: adopt_database() once it has finished');
ok(settled('restored', '2031-08', $accounts), 'restore: adopted, its scheduler bills 2031-08, one record per account');
is(qd('restored', q{SELECT count(*) FROM billguard.journal WHERE event_type = 'BillingTickIssued'
	AND event ->> 'billing_period' = '2031-08'}), '1', 'restore: 2031-08 issued once');
my $by_key = charges_by_key($emulator);
my @wrong = grep { my ($key, $charge) = split /\|/; !(@{ $by_key->{$key} // [] } == 1 && $by_key->{$key}[0] eq $charge) }
  split /\n/, qd('restored', q{SELECT idempotency_key || '|' || charge_id FROM billguard.billing_records WHERE billing_period = '2031-08'});
is(scalar(@wrong), 0, 'restore: each with the one charge the emulator holds for its key');
is(qd('restored', q{SELECT count(*) FROM billguard.journal WHERE event_type = 'DatabaseAdopted'}), '1',
	'restore: the journal records the adoption');

# ---- pg_restore into a second database; the namespace -------------------------------

$node->q1('CREATE DATABASE restored_again');
($out, $err) = run_command([ 'pg_restore', '-d', $node->connstr('restored_again'), $dump ]);
is($err, '', 'pg_restore: into a second database, without an error');
ok(wait_until('its dispatcher, paused', 30, sub {
	qd('restored_again', q{SELECT coalesce(pause_reason, '') FROM billguard.dispatch_status}) =~ /^this database was restored from a dump/ }),
	'pg_restore: it waits to be adopted, and says so');
is(qd('restored_again', q{SELECT count(*) FROM billguard.billing_records WHERE billing_period = '2031-08'}), '0',
	'pg_restore: it bills nothing');
like(qd('restored_again', 'SELECT billguard.adopt_database()'), qr/^adopted/, 'pg_restore: adopted');
my $restored_name = 'restored';
ok(wait_until('the namespace conflict', 30, sub {
	qd('restored_again', q{SELECT coalesce(pause_reason, '') FROM billguard.dispatch_status})
	  =~ /^database "$restored_name" of this cluster bills with the same billguard\.key_namespace \('akka-billing'\)/ }),
	'pg_restore: adopted while restored bills with the same namespace, it pauses and names restored');
like(qd('restored_again', 'SELECT pause_reason FROM billguard.scheduler_status'), qr/same billguard\.key_namespace/,
	'pg_restore: so does its scheduler_status');
sleep 1;
is(qd('restored_again', q{SELECT count(*) FROM billguard.billing_records WHERE billing_period = '2031-08'}), '0',
	'pg_restore: and it bills nothing');
is(qd('restored', 'SELECT paused FROM billguard.dispatch_status'), 'f', 'restored bills on');

# ---- copy ---------------------------------------------------------------------------

my $start = time;
$node->q1('CREATE DATABASE copy TEMPLATE restored');
cmp_ok(time - $start, '<', 4, 'copy: CREATE DATABASE ... TEMPLATE of the served database succeeds at once');
qd('restored', q{UPDATE billguard.accounts SET active = false WHERE customer_id = 'cust_0001'});
ok(wait_until('the copy, paused', 30, sub {
	qd('copy', q{SELECT coalesce(pause_reason, '') FROM billguard.dispatch_status}) =~ /^this database is a copy of database restored / }),
	'copy: it waits to be adopted, and says it is a copy of restored');
$offset = set_scheduler($node, scheduler_now => '2031-10-01 00:00:05+00');
ok(settled('restored', '2031-09', $accounts - 1),
	'copy: the original bills 2031-09: every active account, not the one deactivated');
sleep 1;
is(qd('copy', q{SELECT count(*) FROM billguard.billing_records WHERE billing_period = '2031-09'}), '0',
	'copy: the copy bills nothing');
my $deactivated = qd('restored', q{SELECT billguard.idempotency_key('cust_0001', '2031-09')});
is(scalar(@{ succeeded_for_key($emulator, $deactivated) }), 0, 'copy: the customer deactivated in the original is not charged');

$node->stop;
$emulator->stop;
done_testing();
