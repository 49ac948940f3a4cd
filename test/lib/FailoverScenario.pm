# The failover scenario of test/t/166 (synchronous replication) and 167
# (asynchronous): a primary and its streaming replica, both with billguard
# preloaded and the scheduler on. The primary's scheduler bills a period and
# its dispatcher sends it through the emulator; in the middle the primary is
# crashed (stop('immediate')) and the replica promoted; the dispatcher the
# promotion starts finishes the period.
#
#   sync    synchronous_standby_names names the replica: every claim is on
#           it before its request leaves. The emulator answers slowly, so
#           requests are in flight at the crash; the promoted node re-sends
#           them with their keys and the emulator replays the originals.
#   async   the replica is cut off (primary_conninfo emptied) while the
#           primary goes on claiming and recording answers, then the primary
#           crashes: the promoted node lacks answers the emulator has (the
#           test proves it before promoting). The emulator forgets keys after
#           a few seconds and the replica's idempotency_window is 1 s, so the
#           promoted node searches before it re-sends, and finds them.
#
# Either way: nothing of billguard runs on the replica before the promotion;
# the promotion starts its dispatcher without a restart; the scheduler's
# tick is issued once; exactly one succeeded charge per key at the emulator,
# and every record completed with it.
package FailoverScenario;

use strict;
use warnings;
use List::Util qw(max);
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep time);
use Exporter 'import';
use BillguardTest;
use BillguardNode;
use SchedulerScenario;

our @EXPORT = qw(run_failover);

my $accounts = 300;
my $period = '2031-08';
my $key_ttl = 4;    # seconds the emulator keeps a key, when async

# Completed records of the period on $node.
sub completed {
	my ($node) = @_;
	return $node->q1("SELECT count(*) FROM billguard.billing_records WHERE billing_period = '$period' AND status = 'completed'");
}

sub run_failover {
	my ($mode) = @_;
	my $async = $mode eq 'async';
	my $emulator = start_emulator(latency_ms => 200, $async ? (idempotency_ttl => $key_ttl) : ());
	my $primary = BillguardNode->dispatching("${mode}_primary", $emulator, { allows_streaming => 1 },
		'billguard.max_requests_per_second = 40', 'billguard.max_inflight = 8');
	$primary->add_accounts($accounts);

	$primary->backup('base');
	my $standby = BillguardNode->new("${mode}_standby");
	$standby->init_from_backup($primary, 'base', has_streaming => 1);
	my $key_file = $standby->set_api_key($StripeEmulatorHarness::DEFAULT_API_KEY);
	$standby->append_conf('postgresql.conf', "billguard.api_key_file = '$key_file'");
	$standby->append_conf('postgresql.conf', "billguard.idempotency_window = '1s'") if $async;
	$standby->start;
	if (!$async) {
		$primary->append_conf('postgresql.conf', "synchronous_standby_names = '" . $standby->name . "'");
		$primary->reload;
		ok($primary->poll_query_until('postgres', q{SELECT count(*) = 1 FROM pg_stat_replication WHERE sync_state = 'sync'}),
			"$mode: the replica is synchronous");
	}
	$primary->wait_for_catchup($standby);

	is($standby->billguard_processes, '', "$mode: no billguard launcher or dispatcher runs on the replica");
	like($standby->q1('SELECT not_served_reason FROM billguard.dispatch_status'), qr/the server is in recovery/,
		"$mode: the replica's dispatch_status says it is in recovery");

	# The same schedule on both nodes: the replica's must not tick.
	my $standby_offset = set_scheduler($standby, auto_bill => 'monthly', scheduler_now => '2031-09-01 00:00:05+00');
	my $offset = set_scheduler($primary, auto_bill => 'monthly', scheduler_now => '2031-09-01 00:00:05+00');
	like(wait_for_tick($primary, $offset), qr/billed $period .*: $accounts records claimed/,
		"$mode: the primary's scheduler bills $period");

	if ($async) {
		$primary->wait_for_catchup($standby);
		$standby->append_conf('postgresql.conf', "primary_conninfo = ''");
		$standby->reload;
		ok($primary->poll_query_until('postgres', 'SELECT count(*) = 0 FROM pg_stat_replication'),
			'async: the replica is cut off from the primary');
		my $replicated = completed($standby);
		ok(wait_until('the primary to record 60 answers the replica never gets', 60,
			sub { completed($primary) >= $replicated + 60 }), 'async: the primary records answers the replica never gets');
	} else {
		ok(wait_until('a third of the period completed', 60, sub { completed($primary) >= $accounts / 3 }),
			'sync: a third of the period is completed');
	}
	cmp_ok(completed($primary), '<', $accounts, "$mode: the period is still under way when the primary crashes");
	$primary->stop('immediate');

	if ($async) {
		# What the replica has of the period, against what the emulator charged.
		my %completed_on_replica = map { $_ => 1 } split /\n/, $standby->q1(qq{
			SELECT idempotency_key FROM billguard.billing_records WHERE billing_period = '$period' AND status = 'completed'});
		my $charged = charges_by_key($emulator);
		my @lost = grep { !$completed_on_replica{$_} } keys %$charged;
		cmp_ok(scalar @lost, '>', 0, 'async: the replica lacks answers the emulator has (lost in the failover)');
		note(scalar(@lost) . ' charged keys without their answer on the replica');
		# Past the emulator's key TTL, a re-send with the key would charge again.
		my $newest = max(map { $_->{created} } @{ $emulator->ledger });
		my $pause = $newest + $key_ttl + 1.5 - time;
		sleep $pause if $pause > 0;
	}

	unlike(substr(slurp_file($standby->logfile), $standby_offset), qr/billguard scheduler|billguard dispatcher: started/,
		"$mode: nothing of billguard ran on the replica before its promotion");
	my $started = $standby->q1('SELECT pg_postmaster_start_time()');
	$offset = -s $standby->logfile;
	$standby->promote;
	ok($standby->wait_for_new_dispatcher(0, 60), "$mode: the promotion starts a dispatcher");
	is($standby->q1('SELECT pg_postmaster_start_time()'), $started, "$mode: without a restart");
	like(wait_for_tick($standby, $offset), qr/$period \(due 2031-09-01 00:00 UTC\) was issued already/,
		"$mode: the promoted node's scheduler finds $period issued");

	ok($standby->wait_until_settled($period, 180), "$mode: the promoted node finishes the period");
	billed_once($standby, $emulator, $mode, $period, $accounts);
	my $replayed = $standby->q1(qq{SELECT count(*) FROM billguard.journal WHERE event_type = 'BillingCompleted'
		AND (event ->> 'replayed')::boolean AND persistence_id LIKE 'billing-%-$period'});
	my $searched = $standby->q1(qq{SELECT count(*) FROM billguard.journal WHERE event_type = 'ChargeReconciled'
		AND event ->> 'via' = 'search' AND persistence_id LIKE 'billing-%-$period'});
	note("$mode: $replayed answers replayed by the emulator, $searched charges found by search");
	if ($async) {
		cmp_ok($searched, '>', 0, 'async: charges whose answers were lost are found by the past-window search');
	} else {
		cmp_ok($replayed, '>', 0, 'sync: requests in flight at the crash are re-sent with their keys and replayed');
	}

	$standby->stop;
	$emulator->stop;
	return;
}

1;
