# No dispatcher statement waits without bound on a lock a user can take.
# Whoever maintains the accounts may lock billguard.accounts (its UPDATE
# grant allows LOCK TABLE in any mode); a session of that role holds it
# ACCESS EXCLUSIVE across the scheduler's bill instant:
#   - the tick gives up waiting after lock_timeout and is tried again; the
#     dispatcher meanwhile sends the records of another period (before: the
#     tick waited inside the dispatcher, and nothing was sent for any period);
#   - dispatch_status.waiting_for, scheduler_status.pause_reason and the log
#     name what it waits for: the table, the lock mode, the session's pid and
#     role (before: the status said running);
#   - once the lock is released, the tick bills the period, once per account.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use BillguardTest;
use BillguardNode;
use SchedulerScenario;

my $accounts = 12;
my $emulator = start_emulator();
my $node = BillguardNode->dispatching('lock_waits', $emulator);
$node->add_accounts($accounts);
$node->q1(q{
	CREATE ROLE billing_accounts LOGIN;
	GRANT USAGE ON SCHEMA billguard TO billing_accounts;
	GRANT SELECT, INSERT, UPDATE ON billguard.accounts TO billing_accounts;
	GRANT EXECUTE ON FUNCTION billguard.is_valid_customer_id(text) TO billing_accounts});

# Records of another period, claimed while the dispatcher has no key.
my $key_file = $node->q1('SHOW billguard.api_key_file');
$node->reload_with(api_key_file => '');
is($node->q1("SELECT initiated FROM billguard.bill_period('2031-06')"), $accounts, '2031-06 claimed, not sent (no key)');

my %locker;
$locker{handle} = IPC::Run::start(
	[ 'psql', '-XAtq', '-d', $node->connstr('postgres'), '-U', 'billing_accounts',
	  '-c', "SET application_name = 'accounts_locker'",
	  '-c', q{BEGIN; LOCK TABLE billguard.accounts IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(600)} ],
	'>', \$locker{out}, '2>', \$locker{err});
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 1 FROM pg_locks l JOIN pg_stat_activity a USING (pid)
	 WHERE a.application_name = 'accounts_locker' AND l.relation = 'billguard.accounts'::regclass
	   AND l.mode = 'AccessExclusiveLock' AND l.granted}),
	'the accounts maintainer holds billguard.accounts locked, ACCESS EXCLUSIVE');
my $locker_pid = $node->q1(q{SELECT pid FROM pg_stat_activity WHERE application_name = 'accounts_locker'});

my $offset = set_scheduler($node, auto_bill => 'monthly', scheduler_now => '2031-09-01 00:00:05+00');
$node->reload_with(api_key_file => $key_file);
ok(wait_until('2031-06 to settle', 30, sub {
	$node->q1(q{SELECT count(*) FROM billguard.billing_records WHERE billing_period = '2031-06' AND status <> 'completed'}) eq '0' }),
	'while the lock is held, the dispatcher sends 2031-06');
my $waiting = '';
ok(wait_until('dispatch_status to name the lock', 30, sub {
	$waiting = $node->q1(q{SELECT coalesce(waiting_for, '') FROM billguard.dispatch_status}) }),
	'dispatch_status.waiting_for says the dispatcher waits for a lock');
like($waiting, qr/^the scheduler's tick gave up waiting 1000 ms for a lock: billguard\.accounts is locked \(AccessExclusiveLock\) by pid $locker_pid \(role billing_accounts, application accounts_locker, for \d+ s\); trying again every 5 s$/,
	'it names the table, the mode, the session and its role');
like($node->q1('SELECT pause_reason FROM billguard.scheduler_status'), qr/billguard\.accounts is locked \(AccessExclusiveLock\) by pid $locker_pid/,
	'scheduler_status.pause_reason says the same');
like(substr(slurp_file($node->logfile), $offset), qr/WARNING:  billguard scheduler: the scheduler's tick gave up waiting 1000 ms for a lock: billguard\.accounts is locked/,
	'and the log');
is($node->records_of('2031-08'), '0', '2031-08 is not billed while the lock is held');
my ($wrong) = charged_once_each($node, $emulator, '2031-06');
is($wrong, '', '2031-06: one charge per record');

$offset = -s $node->logfile;
$node->safe_psql('postgres', "SELECT pg_terminate_backend($locker_pid)");
$locker{handle}->finish;
like(wait_for_tick($node, $offset, 30), qr/billed 2031-08 \(due 2031-09-01 00:00 UTC\): $accounts records claimed/,
	'once the lock is released, the tick bills 2031-08');
billed_once($node, $emulator, 'after the lock', '2031-08', $accounts);
ok(wait_until('the wait to be forgotten', 10, sub {
	$node->q1(q{SELECT waiting_for IS NULL FROM billguard.dispatch_status}) eq 't' }),
	'dispatch_status no longer names a lock');
is($node->q1('SELECT pause_reason IS NULL FROM billguard.scheduler_status'), 't', 'nor does scheduler_status');

$node->stop;
$emulator->stop;
done_testing();
