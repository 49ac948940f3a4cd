# What pg_stat_activity shows billguard's processes waiting for. On
# PostgreSQL 17 and later each wait carries billguard's own name
# (wait_event_type Extension); before 17 each shows as plain Extension:
#   - the launcher between rescans: BillguardLauncherIdle;
#   - an idle dispatcher: BillguardDispatcherIdle;
#   - a dispatcher started on a read-only server: BillguardReadOnlyServer;
#   - DROP DATABASE while no worker slot is free for its history probe:
#     BillguardProbeSlot, for the 5 s it waits before it gives up.
# A statement on a whole database waiting for its dispatcher to leave
# (BillguardDispatcherExit) waits milliseconds: too short to be seen here.
# await_billing's wait, BillguardTerminalCommit, is 180_await_billing.pl's.
use strict;
use warnings;
use IPC::Run;
use PostgreSQL::Test::Utils;
use Test::More;
use BillguardTest;
use BillguardNode;

my $emulator = start_emulator();
my $node = BillguardNode->dispatching('wait_events', $emulator, "billguard.poll_interval = '1h'");
my $named = $node->pg_version >= 17;

# "type|event" of the first process of a backend_type.
sub wait_of {
	my ($backend_type) = @_;
	return $node->q1("SELECT wait_event_type || '|' || coalesce(wait_event, '') FROM pg_stat_activity
		 WHERE backend_type = '$backend_type' ORDER BY pid LIMIT 1");
}

# Polls, since a process is between waits now and then; the last value
# seen tells what it showed instead.
sub shows {
	my ($backend_type, $name, $what) = @_;
	my $expected = 'Extension|' . ($named ? $name : 'Extension');
	my $seen = '';
	ok(wait_until($what, 30, sub { ($seen = wait_of($backend_type)) eq $expected }),
		"$what: pg_stat_activity shows $expected")
	  or diag("it showed '$seen'");
}

shows('billguard launcher', 'BillguardLauncherIdle', 'the launcher between rescans');
shows('billguard dispatcher', 'BillguardDispatcherIdle', 'an idle dispatcher');

# A dispatcher that starts on a read-only server waits for it to be writable.
$node->q1('ALTER SYSTEM SET default_transaction_read_only = on');
$node->restart;
shows('billguard dispatcher', 'BillguardReadOnlyServer', 'a dispatcher on a read-only server');
$node->q1('SET default_transaction_read_only = off; ALTER SYSTEM RESET default_transaction_read_only; SELECT pg_reload_conf()');
shows('billguard dispatcher', 'BillguardDispatcherIdle', 'the same dispatcher once the server is writable');

$node->stop;

# Two worker slots: the launcher's and postgres's dispatcher's. A DROP
# DATABASE's probe finds none free.
my $small = BillguardNode->dispatching('wait_slots', $emulator,
	'max_worker_processes = 2',
	'max_logical_replication_workers = 0',
	'max_parallel_workers_per_gather = 0');
$small->safe_psql('postgres', 'CREATE DATABASE gone');
ok(wait_until('the dispatcher takes the second slot', 30, sub {
	$small->safe_psql('postgres', 'SELECT worker_running FROM billguard.dispatch_status') eq 't' }),
	'the launcher and a dispatcher hold both worker slots');
my ($out, $err) = ('', '');
my $drop = IPC::Run::start([ 'psql', '-XAtq', '-d', $small->connstr('postgres'), '-c', 'DROP DATABASE gone' ],
	'>', \$out, '2>', \$err);
my $expected = 'Extension|' . ($named ? 'BillguardProbeSlot' : 'Extension');
my $seen = '';
ok(wait_until('the DROP waiting for a slot', 5, sub {
	($seen = $small->safe_psql('postgres', "SELECT wait_event_type || '|' || coalesce(wait_event, '')
		FROM pg_stat_activity WHERE query = 'DROP DATABASE gone'")) eq $expected }),
	"DROP DATABASE waiting for a slot for its probe: pg_stat_activity shows $expected")
  or diag("it showed '$seen'");
$drop->finish;
like($err, qr/No background worker slot is free for the probe/, 'and it gives up after its wait');
$small->stop;
done_testing();
