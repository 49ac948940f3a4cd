# Every database that has the extension is served: a
# launcher starts one dispatcher per such database. Before, a second
# database's billings were 'initiated' and then stayed pending for ever.
#   - three databases with the extension: postgres and early (created before
#     the server starts) and late (created while it runs, no restart), and
#     plain without it: plain keeps no connection, and CREATE DATABASE ...
#     TEMPLATE plain works right after a start, while the launcher probes;
#   - billing in early and late is sent: exactly one charge per key at the
#     emulator; poll_interval is an hour, so each commit woke its own
#     database's dispatcher; each dispatch_status shows its own worker;
#   - kill -9 of a dispatcher, kill -9 of the launcher (both crash-restart
#     the server), SIGTERM of a dispatcher, SIGTERM of the launcher: at no
#     sampled moment two dispatchers in one database, afterwards exactly one
#     per served database, and billing still sent once per key;
#   - a served database marked IS_TEMPLATE is left at once, so CREATE
#     DATABASE ... TEMPLATE of it works; the copy has the extension and is
#     found and served without CREATE EXTENSION (it waits to be adopted);
#     DROP DATABASE ... WITH (FORCE) of a served database whose history was
#     archived works, and so does its owner's ALTER DATABASE ...
#     ALLOW_CONNECTIONS false followed by DROP DATABASE.
# Each database bills with a key namespace of its own: two served databases
# with accounts and one namespace would share every key at Stripe.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep time);
use BillguardTest;
use BillguardNode;

my $emulator = start_emulator();
my $node = BillguardNode->dispatching('every_db', $emulator,
	"billguard.database = ''",    # unset: every database
	"billguard.poll_interval = '1h'",
	"restart_after_crash = on");
$node->safe_psql('postgres', 'CREATE DATABASE plain');
$node->safe_psql('postgres', 'CREATE DATABASE early');
$node->safe_psql('postgres', q{ALTER DATABASE early SET billguard.key_namespace = 'early-billing'});
$node->safe_psql('early', 'CREATE EXTENSION billguard');
$node->restart;

# A brief probe of plain may be running right now: CREATE DATABASE waits for it.
$node->safe_psql('postgres', 'CREATE DATABASE plain_copy TEMPLATE plain');
pass('CREATE DATABASE ... TEMPLATE plain works right after the server started');

$node->safe_psql('postgres', 'CREATE DATABASE late');
$node->safe_psql('postgres', q{ALTER DATABASE late SET billguard.key_namespace = 'late-billing'});
$node->safe_psql('late', 'CREATE EXTENSION billguard');

my @served = qw(postgres early late);
my $most_seen = 0;    # the most dispatchers ever seen in one database

# database => number of dispatchers connected to it.
sub dispatchers {
	my %count = map { split /\|/ } grep { length } split /\n/, $node->safe_psql('postgres', q{
		SELECT datname || '|' || count(*) FROM pg_stat_activity
		 WHERE backend_type = 'billguard dispatcher' GROUP BY datname});
	for (values %count) { $most_seen = $_ if $_ > $most_seen }
	return \%count;
}

# Waits until exactly the served databases have one dispatcher each (and no
# other database has one), sampling all the while.
sub exactly_one_each {
	my ($label) = @_;
	my $seen;
	my $ok = wait_until("one dispatcher in each of @served ($label)", 60, sub {
		$seen = dispatchers();
		return join(',', map { "$_=" . ($seen->{$_} // 0) } sort keys %$seen)
		  eq join(',', map { "$_=1" } sort @served);
	});
	ok($ok, "$label: exactly one dispatcher in each served database, none elsewhere");
	diag('dispatchers: ' . join(', ', map { "$_=$seen->{$_}" } sort keys %$seen)) unless $ok;
	is($most_seen, 1, "$label: never two dispatchers in one database");
}

sub pid_in {
	my ($database) = @_;
	return $node->safe_psql('postgres', qq{
		SELECT pid FROM pg_stat_activity WHERE backend_type = 'billguard dispatcher' AND datname = '$database'});
}

sub launcher_pid {
	return $node->safe_psql('postgres', q{
		SELECT coalesce(max(pid), 0) FROM pg_stat_activity WHERE backend_type = 'billguard launcher'});
}

# Bills $period in early and late (20 accounts each); both settle.
sub bill_both {
	my ($period) = @_;
	for my $database (qw(early late)) {
		is($node->safe_psql($database, "SELECT initiated FROM billguard.bill_period('$period')"), '20',
			"$database: $period initiated");
	}
	for my $database (qw(early late)) {
		ok(wait_until("$database $period settled", 60, sub {
			$node->safe_psql($database, qq{
				SELECT count(*) FROM billguard.billing_records
				 WHERE billing_period = '$period' AND status <> 'completed'}) eq '0' }),
			"$database: every record of $period completed");
	}
}

sub one_charge_per_key {
	my ($label, $keys) = @_;
	my $by_key = charges_by_key($emulator);
	is(scalar(keys %$by_key), $keys, "$label: the emulator holds charges for $keys keys");
	is(scalar(grep { @{ $by_key->{$_} } != 1 } keys %$by_key), 0, "$label: exactly one charge per key");
}

exactly_one_each('after start and CREATE EXTENSION in late');
ok(wait_until('no connection to plain', 30, sub {
	$node->safe_psql('postgres', q{
		SELECT count(*) FROM pg_stat_activity WHERE datname IN ('plain', 'plain_copy')}) eq '0' }),
	'no process stays connected to a database without the extension');

for my $database (qw(early late)) {
	$node->safe_psql($database, qq{
		INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method)
		SELECT '${database}_' || g, 'cus_${database}_' || g, 1000 + g, 'usd', 'pm_card_visa'
		  FROM generate_series(1, 20) g});
}
bill_both('2026-08');
one_charge_per_key('2026-08', 40);

my %pids = map { ($_ => pid_in($_)) } @served;
isnt($pids{early}, $pids{late}, 'early and late have dispatchers of their own');
for my $database (@served) {
	is($node->safe_psql($database,
		"SELECT worker_running || '|' || worker_pid || '|' || coalesce(not_served_reason, '') FROM billguard.dispatch_status"),
		"true|$pids{$database}|", "$database: dispatch_status shows its own dispatcher");
}

# ---- crashes and signals ------------------------------------------------------------

kill('KILL', $pids{early}) or die "kill -9 $pids{early}: $!";
exactly_one_each('after kill -9 of a dispatcher');
bill_both('2026-09');

my $launcher = launcher_pid();
ok($launcher, 'the launcher runs, as billguard launcher');
kill('KILL', $launcher) or die "kill -9 $launcher: $!";
ok(wait_until('a new launcher', 60, sub { my $p = launcher_pid(); $p && $p != $launcher }),
	'after kill -9 of the launcher a new launcher runs');
exactly_one_each('after kill -9 of the launcher');
bill_both('2026-10');

%pids = map { ($_ => pid_in($_)) } @served;
kill('TERM', $pids{late}) or die "kill $pids{late}: $!";
ok(wait_until('a new dispatcher in late', 60, sub { my $p = pid_in('late'); $p && $p != $pids{late} }),
	'after SIGTERM the launcher starts a new dispatcher in late');
exactly_one_each('after SIGTERM of a dispatcher');

%pids = map { ($_ => pid_in($_)) } @served;
$launcher = launcher_pid();
kill('TERM', $launcher) or die "kill $launcher: $!";
ok(wait_until('a new launcher', 60, sub { my $p = launcher_pid(); $p && $p != $launcher }),
	'after SIGTERM the postmaster starts the launcher again');
exactly_one_each('after SIGTERM of the launcher');
is(join(',', map { pid_in($_) } @served), join(',', map { $pids{$_} } @served),
	'the dispatchers kept running through the launcher\'s restart');
bill_both('2026-11');
one_charge_per_key('after the crashes', 160);

# ---- a served database as a template, and DROP DATABASE ----------------------------

# Marked a template, early is left at once (ALTER DATABASE tells the launcher).
$node->safe_psql('postgres', 'ALTER DATABASE early IS_TEMPLATE true');
$node->safe_psql('postgres', 'CREATE DATABASE early_copy TEMPLATE early');
pass('ALTER DATABASE early IS_TEMPLATE true, then CREATE DATABASE ... TEMPLATE early works');
$node->safe_psql('postgres', 'ALTER DATABASE early IS_TEMPLATE false');
# No CREATE EXTENSION tells about the copy: the launcher's look at pg_database finds it.
@served = qw(postgres early late early_copy);
exactly_one_each('early again, and its copy, which has the extension');

$node->safe_psql('late', q{SELECT * FROM billguard.archive_history('billguard_archive')});
$node->safe_psql('postgres', 'DROP DATABASE late WITH (FORCE)');
pass('DROP DATABASE ... WITH (FORCE) of a served database whose history was archived works');
# An owner who is no superuser may not stop the dispatcher: ALLOW_CONNECTIONS false first.
$node->safe_psql('postgres', 'CREATE ROLE copy_owner LOGIN; ALTER DATABASE early_copy OWNER TO copy_owner');
$node->safe_psql('postgres', 'ALTER DATABASE early_copy ALLOW_CONNECTIONS false', extra_params => [ '-U', 'copy_owner' ]);
$node->safe_psql('postgres', 'DROP DATABASE early_copy', extra_params => [ '-U', 'copy_owner' ]);
pass('its owner (no superuser): ALTER DATABASE ... ALLOW_CONNECTIONS false, then DROP DATABASE works');
@served = qw(postgres early);
exactly_one_each('after DROP DATABASE of late and early_copy');

$node->stop;
$emulator->stop;
done_testing();
