# billguard.idempotency_window never exceeds what Stripe promises: Stripe
# may prune an idempotency key once it is 24 hours old, and a record trusted
# for longer is re-sent as a plain POST, which Stripe takes for a new charge.
#   setting   postgresql.conf says '2d': the server starts, with the default
#             23h in force and a WARNING naming the range (1 .. 86400 s);
#             pg_file_settings says the line could not be applied; ALTER
#             SYSTEM refuses 25h (22023) and takes 24h
#   billing   a record first dispatched 25 hours ago whose answer was lost:
#             its charge exists at the emulator, which has pruned the key
#             (--idempotency-ttl 3 stands for Stripe's 24 h). The dispatcher
#             searches before it sends: one charge, the record completed
#             with it (ChargeReconciled). With the window at 2 days it was
#             re-sent as a plain POST: two charges.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep time);
use BillguardTest;
use BillguardNode;

my $ttl = 3;
my $emulator = start_emulator(idempotency_ttl => $ttl);
my $node = BillguardNode->dispatching('window_cap', $emulator, "billguard.idempotency_window = '2d'");

# ---- setting ----------------------------------------------------------------------------

is($node->q1('SHOW billguard.idempotency_window'), '23h',
	"postgresql.conf's 2d is not applied: the default 23h is in force");
like(slurp_file($node->logfile),
	qr/WARNING:  172800 s is outside the valid range for parameter "billguard.idempotency_window" \(1( s)? \.\. 86400( s)?\)/,
	'the server says so at start');
is($node->q1(q{SELECT applied || ' ' || error FROM pg_file_settings WHERE name = 'billguard.idempotency_window'}),
	'false setting could not be applied', 'pg_file_settings shows the line was not applied');
is($node->q1(q{SELECT max_val FROM pg_settings WHERE name = 'billguard.idempotency_window'}), '86400',
	'its maximum is 24 hours');
my ($rc, $out, $err) = $node->psql('postgres', "ALTER SYSTEM SET billguard.idempotency_window = '25h'");
like($err, qr/ERROR:  90000 s is outside the valid range for parameter "billguard.idempotency_window" \(1( s)? \.\. 86400( s)?\)/,
	'ALTER SYSTEM refuses 25h');
is($node->q1(q{SELECT count(*) FROM pg_file_settings WHERE sourcefile LIKE '%postgresql.auto.conf' AND name = 'billguard.idempotency_window'}),
	'0', 'and writes nothing');
($rc, $out, $err) = $node->psql('postgres', "ALTER SYSTEM SET billguard.idempotency_window = '24h'");
is($rc, 0, 'ALTER SYSTEM takes 24h') or diag($err);
$node->q1('ALTER SYSTEM RESET billguard.idempotency_window');

# ---- billing ----------------------------------------------------------------------------

$node->add_accounts(1);
my ($customer, $period) = ('cust_000001', '2026-09');
my $key = $node->key_of($customer, $period);

# Nothing is sent while the key file is missing.
$node->reload_with(api_key_file => $node->basedir . '/missing.key');
ok(wait_until('the dispatcher to pause', 20, sub {
	$node->q1('SELECT paused FROM billguard.dispatch_status') eq 't' }), 'the dispatcher is paused');
is($node->bill($customer, $period), 'initiated', 'billing initiated');

# What a first attempt 25 hours ago left: the charge at Stripe, its answer lost.
$node->q1(qq{
	UPDATE billguard.billing_records
	   SET created_at = now() - interval '25 hours', first_dispatched_at = now() - interval '25 hours',
	       attempts = 1
	 WHERE customer_id = '$customer' AND billing_period = '$period'});
my $body = $node->q1(qq{
	SELECT billguard.charge_request_body('/v1/payment_intents', idempotency_key, customer_id, billing_period,
	                                     amount_cents, currency, stripe_customer, payment_method)
	  FROM billguard.billing_records WHERE customer_id = '$customer' AND billing_period = '$period'});
my $first = $emulator->request('POST', '/v1/payment_intents', $body, idempotency_key => $key);
is($first->{status}, 200, 'the first attempt charged');
my $charge = $first->{json}{id} // '(none)';
sleep $ttl + 1;    # Stripe's memory of the key is gone

$node->reload_with(api_key_file => $node->basedir . '/stripe.key');
ok(wait_until("$customer/$period settled", 30, sub { $node->status_of($customer, $period) eq 'completed' }),
	'the record is completed');
is(scalar(@{ succeeded_for_key($emulator, $key) }), 1, 'exactly one charge at the emulator for the key');
is($node->q1("SELECT charge_id FROM billguard.billing_records WHERE customer_id = '$customer' AND billing_period = '$period'"),
	$charge, 'the record carries the first attempt\'s charge');
is($node->event_types($customer, $period, 'action'), 'BillingInitiated,ChargeAttempted(search),ChargeReconciled',
	'the dispatcher searched first and reconciled, sending no charge');

$node->stop;
$emulator->stop;
done_testing();
