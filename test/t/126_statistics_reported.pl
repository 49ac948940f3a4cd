# Autovacuum must see the dispatcher's work while the dispatcher lives: its
# updates of billing_records and inserts into the journal are reported to
# the cumulative statistics after its transactions (as PostgreSQL's own
# workers do), not only when it exits.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use BillguardTest;
use DispatchScenario;

my $emulator = start_emulator();
my $node = dispatch_node('statistics', $emulator);
add_accounts($node, 50);
my $pid = wait_for_new_dispatcher($node, undef, 20);
ok($pid, 'a dispatcher runs');
my $counts = sub {
	return q1($node, q{SELECT (SELECT n_tup_upd FROM pg_stat_user_tables WHERE relid = 'billguard.billing_records'::regclass)
		|| '/' || (SELECT n_tup_ins FROM pg_stat_user_tables WHERE relid = 'billguard.journal'::regclass)});
};
is($counts->(), '0/0', 'no updates of billing_records nor journal inserts counted yet');
is(q1($node, "SELECT initiated FROM billguard.bill_period('2031-02')"), '50', '50 billings initiated (50 journal inserts)');
ok(wait_until_settled($node, '2031-02', 60), 'the dispatcher completes the period');
ok(wait_for('the dispatcher\'s statistics', 30, sub {
		my ($updates, $inserts) = split m{/}, $counts->();
		$updates >= 100 && $inserts >= 150 }),
	'pg_stat_user_tables counts its updates (a claim and an answer each) and its journal inserts')
  or diag('billing_records n_tup_upd / journal n_tup_ins: ' . $counts->());
is(dispatcher_pid($node), $pid, 'while the same dispatcher still runs');

$node->stop;
$emulator->stop;
done_testing();
