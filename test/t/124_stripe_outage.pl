# A Stripe outage longer than the old attempts budget must fail nothing.
#
#   outage   Stripe (the emulator) is down while 20 records are billed, with
#            max_attempts = 3 (which used to fail every record in about two
#            seconds); connections are refused for longer than that: nothing
#            ends failed or needs_review, no attempt is counted, the
#            dispatcher holds off (1 s doubling) and says so; Stripe comes
#            back (a new emulator, api_base reloaded): every record is
#            charged once
#   exhausted  an indeterminate answer (503) to every one of max_attempts
#            attempts ends needs_review, never failed: a 5xx does not prove
#            the customer was not charged; retry_period requeues it, and it
#            is charged once
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep time);
use BillguardTest;
use BillguardNode;

my $down = start_emulator();
my $node = BillguardNode->dispatching('outage', $down, 'billguard.max_attempts = 3');
$node->add_accounts(21);
$node->q1("UPDATE billguard.accounts SET active = false WHERE customer_id = 'cust_000021'");
$down->stop;

# ---- outage ----
my $period = '2031-09';
is($node->q1("SELECT initiated FROM billguard.bill_period('$period')"), '20', 'outage: 20 records billed while Stripe is down');
ok(wait_until('a refused request', 30, sub {
		$node->q1(q{SELECT count(*) FROM billguard.journal WHERE event_type = 'ChargeNotSent'}) > 0 }),
	'outage: requests are refused (ChargeNotSent)');
sleep 6;    # three times the old budget
is($node->q1(q{SELECT count(*) FROM billguard.billing_records WHERE status IN ('failed', 'needs_review', 'completed')}), '0',
	'outage: after longer than the old budget nothing failed or needs review');
is($node->q1('SELECT max(attempts) FROM billguard.billing_records'), '0', 'outage: refused connections cost no attempt');
is($node->q1(q{SELECT count(*) FROM billguard.journal WHERE event_type = 'BillingFailed'}), '0',
	'outage: no BillingFailed (nothing was sent)');
like($node->q1(q{SELECT min(last_error) FROM billguard.billing_records r WHERE EXISTS (SELECT FROM billguard.journal j
	WHERE j.event_type = 'ChargeNotSent' AND j.customer_id = r.customer_id)}),
	qr/^not sent: .*connect/i, 'outage: last_error says the request was not sent');
like(slurp_file($node->logfile), qr/billguard dispatcher: Stripe is unreachable .*nothing was sent; trying again in \d+ s/,
	'outage: the dispatcher logs that it holds off');
cmp_ok($node->q1(q{SELECT count(*) FROM billguard.journal WHERE event_type = 'ChargeNotSent'}), '<', 200,
	'outage: it holds off rather than spin (fewer than 200 refused attempts in all)');

my $stripe = start_emulator();
$node->reload_with(api_base => $stripe->url(''));
ok($node->wait_until_settled($period, 60), 'outage over: every record settles');
is($node->q1("SELECT string_agg(status || '=' || n, ',') FROM (SELECT status, count(*) n FROM billguard.billing_records GROUP BY 1) s"),
	'completed=20', 'outage over: all 20 completed');
my $by_key = charges_by_key($stripe);
is(scalar(keys %$by_key) . '/' . scalar(grep { @{ $by_key->{$_} } != 1 } keys %$by_key), '20/0',
	'outage over: 20 keys charged, each exactly once');

# ---- exhausted: three 503s ----
my ($c, $p) = ('cust_000021', '2031-10');
$node->q1("UPDATE billguard.accounts SET active = true WHERE customer_id = '$c'");
$stripe->add_fault(kind => 'status', status => 503, count => 3);
is($node->bill($c, $p), 'initiated', 'exhausted: billed');
ok(wait_until('the record settled', 30, sub { $node->status_of($c, $p) !~ /^(pending|dispatching)$/ }),
	'exhausted: the record settles after max_attempts');
is($node->record_of($c, $p), 'needs_review||3', 'exhausted: three 503s end needs_review, never failed');
like($node->q1("SELECT last_error FROM billguard.billing_records WHERE customer_id = '$c'"),
	qr/^503 .*attempts exhausted, outcome unknown/, 'exhausted: last_error says the outcome is unknown');
is($node->q1("SELECT billguard.retry_period('$p', 'needs_review')"), '1', 'retry_period requeues it');
ok(wait_until('completed', 30, sub { $node->status_of($c, $p) eq 'completed' }), 'and it completes');
is(scalar(@{ succeeded_for_key($stripe, $node->key_of($c, $p)) }), 1, 'charged once');

$node->stop;
$stripe->stop;
done_testing();
