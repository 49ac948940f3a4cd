# SIGTERM to the dispatcher while 16 requests are in flight at a slow Stripe
# (3 s per request): the worker exits at once (measured, < 1 s) without
# waiting for the answers, the launcher starts a new one, which re-sends
# the abandoned records with their stored keys. Stripe is still executing
# the abandoned requests, so a re-send gets 409 idempotency_key_in_use (and
# is retried) or the saved answer replayed: either way exactly one charge
# per key, and every record completed with the emulator's id.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep time);
use JSON::PP;
use BillguardTest;
use BillguardNode;

my $accounts = 24;
my $period = '2030-07';

# True while $pid is a live process (a zombie waiting to be reaped is gone).
sub alive {
	my ($pid) = @_;
	open my $fh, '<', "/proc/$pid/stat" or return 0;
	my $stat = <$fh> // '';
	close $fh;
	my ($state) = $stat =~ /\)\s+(\S)/;
	return defined $state && $state ne 'Z' && $state ne 'X';
}

my $emulator = start_emulator(latency_ms => 3000);
my $node = BillguardNode->dispatching('sigterm', $emulator,
	"billguard.max_inflight = 16",
	"billguard.max_requests_per_second = 200",
	"billguard.request_timeout = '10s'");
$node->add_accounts($accounts, 'sig_');

my $pid = $node->wait_for_new_dispatcher(undef, 15);
ok($pid, "a dispatcher runs (pid $pid)");
is($node->q1("SELECT initiated FROM billguard.bill_period('$period')"), $accounts, "$accounts billings initiated");

# Wait until 16 requests are in flight on both sides.
my ($in_flight, $in_progress) = (0, 0);
wait_until('16 requests in flight at the dispatcher and the emulator', 10, sub {
	$in_flight = $node->q1('SELECT in_flight FROM billguard.dispatch_status');
	$in_progress = $emulator->stats->{in_progress};
	return $in_flight == 16 && $in_progress == 16;
}, interval => 0.02);
is($in_flight, 16, 'dispatch_status shows 16 requests in flight');
is($in_progress, 16, 'the emulator is executing 16 requests');
is($node->q1("SELECT string_agg(status || '=' || n, ',' ORDER BY status) FROM (SELECT status, count(*) n FROM billguard.billing_records GROUP BY 1) s"),
	'dispatching=24', 'all 24 records dispatching: 16 in flight (max_inflight) and 8 claimed ahead (max_inflight / 2)');
is(scalar(@{ $emulator->ledger }), 0, 'nothing has been created yet');

# SIGTERM, and measure how long the worker takes to go.
my $killed_at = time;
is(kill('TERM', $pid), 1, 'SIGTERM sent to the dispatcher');
my $gone = wait_until('the dispatcher to exit', 5, sub { !alive($pid) }, interval => 0.02);
my $gone_after = $gone ? time - $killed_at : 99;
ok($gone, 'the dispatcher exited');
cmp_ok($gone_after, '<', 1, sprintf('it was gone %.3f s after SIGTERM (< 1 s; a request takes 3 s)', $gone_after));
diag(sprintf('SIGTERM with 16 requests in flight: the dispatcher exited after %.0f ms', $gone_after * 1000));
cmp_ok($emulator->stats->{in_progress}, '>', 0, '(the abandoned requests were still executing at the emulator)')
	if $gone_after < 2.5;

my $new_pid = $node->wait_for_new_dispatcher($pid, 15);
ok($new_pid, sprintf('the launcher started a new dispatcher (pid %s) %.1f s after SIGTERM', $new_pid, time - $killed_at));

ok($node->wait_until_settled($period, 60), 'every record settles');
is($node->q1("SELECT string_agg(status || '=' || n, ',') FROM (SELECT status, count(*) n FROM billguard.billing_records GROUP BY 1) s"),
	"completed=$accounts", "all $accounts records completed");
my $by_key = charges_by_key($emulator);
is(scalar(keys %$by_key), $accounts, "charges for $accounts distinct keys");
is(scalar(grep { @{ $by_key->{$_} } != 1 } keys %$by_key), 0, 'exactly one charge per key');
is(scalar(@{ $emulator->ledger }), $accounts, "the emulator created $accounts objects in all");
my %record_charge = map { split /\|/ } split /\n/, $node->q1("SELECT idempotency_key || '|' || charge_id FROM billguard.billing_records");
is(scalar(grep { ($record_charge{$_} // '') ne $by_key->{$_}[0] } keys %$by_key), 0,
	"every record carries the emulator's id for its key");

my $stats = $emulator->stats;
cmp_ok($stats->{replayed}, '>=', 16, "the 16 abandoned requests were answered by replays when re-sent ($stats->{replayed} replays, "
	. "$stats->{in_use_conflicts} 409 in_use)");
is($node->q1(q{SELECT count(*) FROM billguard.journal WHERE event_type = 'BillingCompleted' AND (event ->> 'replayed')::boolean}),
	'16', '16 BillingCompleted events say replayed');
is($node->q1(q{SELECT count(*) FROM billguard.journal WHERE event_type = 'BillingFailed' AND (event ->> 'terminal')::boolean}),
	'0', 'no terminal failure');
is($node->q1(q{SELECT count(*) FROM billguard.billing_records WHERE idempotency_key <> billguard.idempotency_key(customer_id, billing_period)}),
	'0', 'every record kept its content-hash key');
is($node->q1(q{
	SELECT count(*) FROM billguard.journal
	 WHERE event_type = 'ChargeAttempted'
	   AND event ->> 'idempotency_key' <> billguard.idempotency_key(customer_id, substr(persistence_id, length(persistence_id) - 6))}),
	'0', 'every attempt, before and after the restart, used the stored key');

my $log = slurp_file($node->logfile);
like($log, qr/billguard dispatcher: stopping with 16 requests in flight/, 'the log says 16 requests were abandoned');
like($log, qr/billguard dispatcher: re-sending 24 records left dispatching/,
	'the new dispatcher re-sends the 24 (16 abandoned in flight, 8 never sent)');
unlike($log, qr/terminating any other active server processes/,
	'the old worker exited cleanly (no crash-restart of the server); the launcher started the new one');

$node->stop;
$emulator->stop;
done_testing();
