# A database restored from a backup taken between a claim and the send: the
# record knows nothing of the request that was made (no first_dispatched_at)
# and Stripe has pruned the key. Its exact equivalent here: the emulator
# holds a charge made earlier with the record's key and exact request, its
# idempotency TTL has expired, and the record (pending, never dispatched)
# was claimed two days ago. The dispatcher must search before sending: one
# charge, reconciled.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep time);
use BillguardTest;
use BillguardNode;

my $ttl = 2;
my $emulator = start_emulator(idempotency_ttl => $ttl);
my $node = BillguardNode->dispatching('restored', $emulator, "billguard.idempotency_window = '1s'");
$node->add_accounts(1);
my ($c, $p) = ('cust_000001', '2031-12');
my $key = $node->key_of($c, $p);

# The request billguard made before the backup was restored.
my $body = $node->q1(qq{
	SELECT billguard.charge_request_body('/v1/payment_intents', '$key', customer_id, '$p', amount_cents, currency,
	                                     stripe_customer, payment_method)
	  FROM billguard.accounts WHERE customer_id = '$c'});
my $earlier = $emulator->request('POST', '/v1/payment_intents', $body, idempotency_key => $key);
is($earlier->{status}, 200, 'the charge made before the backup was restored succeeded');
my $original = $earlier->{json}{id};
sleep $ttl + 0.5;    # Stripe has pruned the key

$node->q1(qq{BEGIN;
	SELECT status FROM billguard.bill_customer('$c', '$p');
	UPDATE billguard.billing_records SET created_at = now() - interval '2 days' WHERE idempotency_key = '$key';
	COMMIT;});
ok(wait_until('the record settled', 30, sub { $node->status_of($c, $p) eq 'completed' }), 'the restored record completes');
is(scalar(@{ succeeded_for_key($emulator, $key) }), 1, 'exactly one charge for its key at the emulator');
is($node->q1("SELECT charge_id FROM billguard.billing_records WHERE idempotency_key = '$key'"), $original,
	'the record carries the charge made before the restore');
is($node->event_types($c, $p, 'action'), 'BillingInitiated,ChargeAttempted(search),ChargeReconciled',
	'it searched first and reconciled, sending no charge');

$node->stop;
$emulator->stop;
done_testing();
