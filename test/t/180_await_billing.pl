# await_billing, the caller's wait for a billing's outcome, against a real dispatcher
# and the Stripe emulator, on a server whose dispatcher polls once an hour
# and whose callers wait up to an hour, so only a commit can answer them
# within the test's patience:
#   - 50 sessions at once each call bill_customer and then await_billing for
#     the same customer and period while the dispatcher is paused; all 50
#     sleep (wait_event_type Extension; wait_event BillguardTerminalCommit
#     on 17+), then the dispatcher resumes: one charge
#     at the emulator, and every caller is answered with its id;
#   - a terminal update that rolls back announces nothing and the caller
#     sleeps on; the same update committed answers it;
#   - the timeout answers in_progress; pg_cancel_backend and
#     statement_timeout end a wait with 57014, changing nothing;
#   - REPEATABLE READ and SERIALIZABLE, and a caller whose own open
#     transaction claimed the record, are refused (25000) instead of sleeping
#     for nothing; timeout 0 still reads the status there.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use BillguardTest;
use BillguardNode;

my $emulator = start_emulator();
my $node = BillguardNode->dispatching('await', $emulator, 'max_connections = 120', "billguard.poll_interval = '1h'");
$node->add_accounts(3);
my $key_file = $node->q1('SHOW billguard.api_key_file');

# Sessions asleep in await_billing's condition variable.
sub sleeping_callers {
	return $node->q1(q{
		SELECT count(*) FROM pg_stat_activity
		 WHERE wait_event_type = 'Extension' AND query LIKE '%await_billing%' AND pid <> pg_backend_pid()});
}

# A psql session running @sql, each statement in a transaction of its own.
sub start_caller {
	my (@sql) = @_;
	my %c = (out => '', err => '');
	$c{handle} = IPC::Run::start([ 'psql', '-XAtq', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('postgres'),
		map { ('-c', $_) } @sql ], '>', \$c{out}, '2>', \$c{err});
	return \%c;
}

# Waits (at most a minute) for the sessions to end; kills those that do not,
# so a missed wake-up fails the test instead of hanging it for an hour.
sub finish_callers {
	my (@callers) = @_;
	my $all_ended = wait_until('every caller to be answered', 60, sub {
		!grep { still_running($_->{handle}) } @callers });
	for my $c (@callers) {
		$c->{handle}->kill_kill(grace => 1) if $c->{handle}->pumpable;
		$c->{handle}->finish;
	}
	return $all_ended;
}

sub pause_dispatcher {
	$node->reload_with(api_key_file => '');
	wait_until('the dispatcher to pause', 20, sub { $node->q1('SELECT paused FROM billguard.dispatch_status') eq 't' })
	  or die 'the dispatcher did not pause';
}

# ---- 50 callers, one charge, one answer -------------------------------------------------

pause_dispatcher();
my $gate = $node->start_gate;
my @racers = map {
	$node->race_psql("SELECT status FROM billguard.bill_customer('cust_000001', '2026-08', 'req-$_')",
		q{SELECT status || '|' || coalesce(charge_id, '') FROM billguard.await_billing('cust_000001', '2026-08', '1 hour')})
} 1 .. 50;
$node->release_gate($gate, 50);
ok(wait_until('50 callers asleep in await_billing', 60, sub { sleeping_callers() == 50 }),
	'all 50 callers wait, asleep in the condition variable (wait_event Extension)');
# PostgreSQL 17 and later show billguard's own name for the wait.
my $wait_event = $node->pg_version >= 17 ? 'BillguardTerminalCommit' : 'Extension';
is($node->q1(q{
	SELECT string_agg(DISTINCT wait_event, ',') FROM pg_stat_activity
	 WHERE query LIKE '%await_billing%' AND pid <> pg_backend_pid()}), $wait_event,
	"pg_stat_activity names their wait $wait_event");
is($emulator->stats->{requests} // 0, 0, 'nothing was sent while they waited: the dispatcher is paused');
$node->reload_with(api_key_file => $key_file);
ok(finish_callers(@racers), 'every caller is answered once the dispatcher resumes and commits');
is(scalar(grep { $_->{handle}->result != 0 || $_->{err} ne '' } @racers), 0, 'no caller failed')
  or diag(join("\n", map { $_->{err} } grep { $_->{err} ne '' } @racers));
my %claims;
$claims{ (split /\n/, $_->{out})[0] // '' }++ for @racers;
is_deeply(\%claims, { initiated => 1, in_progress => 49 }, 'bill_customer: one initiated, 49 in_progress');
my %answers;
$answers{ (split /\n/, $_->{out})[1] // '' }++ for @racers;
my $key = $node->key_of('cust_000001', '2026-08');
my $charges = succeeded_for_key($emulator, $key);
is(scalar(@$charges), 1, 'the emulator holds exactly one charge for the key');
is_deeply(\%answers, { 'completed|' . ($charges->[0]{id} // '?') => 50 },
	'all 50 callers are answered completed with the id of that charge');
is($node->record_of('cust_000001', '2026-08'), 'completed|' . ($charges->[0]{id} // '?') . '|1',
	'the record holds the same charge, sent once');

# ---- only a commit answers --------------------------------------------------------------

pause_dispatcher();
is($node->q1("SELECT status FROM billguard.bill_customer('cust_000002', '2026-08')"), 'initiated',
	'cust_000002 claimed while the dispatcher is paused');
my $commits = $node->q1("SELECT billguard.terminal_commits('cust_000002', '2026-08')");
my $caller = start_caller(
	q{SELECT status || '|' || coalesce(charge_id, '') FROM billguard.await_billing('cust_000002', '2026-08', '1 hour')});
ok(wait_until('the caller to sleep', 30, sub { sleeping_callers() == 1 }), 'the caller sleeps');
$node->q1(q{
	BEGIN;
	UPDATE billguard.billing_records SET status = 'completed', charge_id = 'pi_rolledback'
	 WHERE customer_id = 'cust_000002' AND billing_period = '2026-08';
	ROLLBACK;});
is($node->q1("SELECT billguard.terminal_commits('cust_000002', '2026-08')"), $commits,
	'a terminal update that rolls back announces nothing');
ok(still_running($caller->{handle}) && sleeping_callers() == 1, 'and the caller sleeps on');
$node->q1(q{
	UPDATE billguard.billing_records SET status = 'completed', charge_id = 'pi_committed'
	 WHERE customer_id = 'cust_000002' AND billing_period = '2026-08'});
ok(finish_callers($caller), 'the same update committed answers the caller at once (its timeout is an hour)');
is($caller->{out}, "completed|pi_committed\n", 'with the committed status and charge id');

# ---- timeout, cancel, statement_timeout -------------------------------------------------

is($node->q1("SELECT status FROM billguard.bill_customer('cust_000003', '2026-08')"), 'initiated',
	'cust_000003 claimed, the dispatcher still paused');
is($node->q1(q{SELECT status || '|' || coalesce(charge_id, '') FROM billguard.await_billing('cust_000003', '2026-08', '1 s')}),
	'in_progress|', 'the timeout passes: in_progress, no charge id');

$caller = start_caller(q{SELECT * FROM billguard.await_billing('cust_000003', '2026-08', '1 hour')});
ok(wait_until('the caller to sleep', 30, sub { sleeping_callers() == 1 }), 'a caller sleeps with an hour to go');
is($node->q1(q{SELECT pg_cancel_backend(pid) FROM pg_stat_activity
                WHERE query LIKE '%await_billing%' AND pid <> pg_backend_pid()}), 't', 'pg_cancel_backend');
ok(finish_callers($caller), 'the cancelled caller returns');
like($caller->{err}, qr/ERROR:  canceling statement due to user request/, '... with 57014, canceled by user request');

$caller = start_caller(q{SET statement_timeout = '1s'},
	q{SELECT * FROM billguard.await_billing('cust_000003', '2026-08', '1 hour')});
ok(finish_callers($caller), 'a caller with statement_timeout = 1s returns');
like($caller->{err}, qr/ERROR:  canceling statement due to statement timeout/, '... with 57014, statement timeout');
is($node->status_of('cust_000003', '2026-08'), 'pending', 'neither changed the record');

# ---- where no commit could show a change -----------------------------------------------

for my $level ('REPEATABLE READ', 'SERIALIZABLE') {
	my ($ret, $out, $err) = $node->psql('postgres', qq{
		BEGIN ISOLATION LEVEL $level;
		SELECT status FROM billguard.await_billing('cust_000003', '2026-08', '0');
		SELECT status FROM billguard.await_billing('cust_000003', '2026-08', '1 hour');});
	is($out, 'in_progress', "$level: timeout 0 reads the status");
	like($err, qr/ERROR:  await_billing cannot wait in a $level transaction: its snapshot never shows the record change/,
		"$level: waiting is refused at once, not slept through");
}
my ($ret, $out, $err) = $node->psql('postgres', q{
	BEGIN;
	SAVEPOINT claim;
	SELECT status FROM billguard.bill_customer('cust_000003', '2026-09');
	RELEASE claim;
	SELECT status FROM billguard.await_billing('cust_000003', '2026-09', '1 hour');});
like($err, qr/ERROR:  await_billing cannot wait: this transaction wrote the billing record of 'cust_000003' in 2026-09 and has not committed/,
	'bill_customer (in a subtransaction) and await_billing in one transaction: refused, the claim is not committed');
is($node->status_of('cust_000003', '2026-09'), '', 'and the claim rolled back with it');

# ---- the paused record completes -------------------------------------------------------

$caller = start_caller(
	q{SELECT status || '|' || coalesce(charge_id, '') FROM billguard.await_billing('cust_000003', '2026-08', '1 hour')});
ok(wait_until('the caller to sleep', 30, sub { sleeping_callers() == 1 }), 'a caller waits for cust_000003');
$node->reload_with(api_key_file => $key_file);
ok(finish_callers($caller), 'the dispatcher resumes: the caller is answered');
my $charge = succeeded_for_key($emulator, $node->key_of('cust_000003', '2026-08'));
is($caller->{out}, 'completed|' . ($charge->[0]{id} // '?') . "\n", 'with the one charge the emulator holds');

$node->stop;
$emulator->stop;
done_testing();
