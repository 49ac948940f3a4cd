# Autovacuum must see the dispatcher's work while the dispatcher lives: its
# updates of billing_records and inserts into the journal are reported to
# the cumulative statistics after its transactions (as PostgreSQL's own
# workers do), not only when it exits; and what its last transactions did
# before it goes idle is reported within seconds, not at its next
# transaction, which may be weeks away:
#   - 50 records settle: the counts appear, while the same dispatcher runs;
#   - with poll_interval = 1h (an idle dispatcher runs no transaction for an
#     hour), a burst of 300 charges, then 3 s idle: pg_stat_user_tables
#     shows every one of the 600 updates of billing_records (a claim and an
#     answer each) and every one of the 600 journal inserts (ChargeAttempted
#     and BillingCompleted).
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);
use BillguardTest;
use BillguardNode;

my $emulator = start_emulator();
my $node = BillguardNode->dispatching('statistics', $emulator);
$node->add_accounts(50);
my $pid = $node->wait_for_new_dispatcher(undef, 20);
ok($pid, 'a dispatcher runs');
my $counts = sub {
	return $node->q1(q{SELECT (SELECT n_tup_upd FROM pg_stat_user_tables WHERE relid = 'billguard.billing_records'::regclass)
		|| '/' || (SELECT n_tup_ins FROM pg_stat_user_tables WHERE relid = 'billguard.journal'::regclass)});
};
is($counts->(), '0/0', 'no updates of billing_records nor journal inserts counted yet');
is($node->q1("SELECT initiated FROM billguard.bill_period('2031-02')"), '50', '50 billings initiated (50 journal inserts)');
ok($node->wait_until_settled('2031-02', 60), 'the dispatcher completes the period');
ok(wait_until('the dispatcher\'s statistics', 30, sub {
		my ($updates, $inserts) = split m{/}, $counts->();
		$updates >= 100 && $inserts >= 150 }),
	'pg_stat_user_tables counts its updates (a claim and an answer each) and its journal inserts')
  or diag('billing_records n_tup_upd / journal n_tup_ins: ' . $counts->());
is($node->dispatcher_pid, $pid, 'while the same dispatcher still runs');

# ---- a burst, then idle --------------------------------------------------------------

$node->reload_with(poll_interval => '1h');
# Every record is claimed once and answered once; nothing is ever deleted from the journal.
my $actual = sub {
	return $node->q1(q{SELECT 2 * (SELECT count(*) FROM billguard.billing_records)
		|| '/' || (SELECT count(*) FROM billguard.journal)});
};
ok(wait_until('all 50 counted', 30, sub { $counts->() eq $actual->() }), 'before the burst: every update and insert counted')
  or diag('counted: ' . $counts->() . ', done: ' . $actual->());
$node->add_accounts(300, 'burst_');
is($node->q1("SELECT initiated FROM billguard.bill_period('2031-03')"), '350', 'a burst: 350 billings initiated');
ok($node->wait_until_settled('2031-03', 60), 'the dispatcher completes them');
sleep 3;
is($counts->(), $actual->(),
	'3 s after the burst, pg_stat_user_tables shows every update and insert of its last transactions');
is($node->dispatcher_pid, $pid, 'still the same dispatcher, idle');

$node->stop;
$emulator->stop;
done_testing();
