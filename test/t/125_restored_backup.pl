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
use DispatchScenario;

my $ttl = 2;
my $emulator = start_emulator(idempotency_ttl => $ttl);
my $node = dispatch_node('restored', $emulator, "billguard.idempotency_window = '1s'");
add_accounts($node, 1);
my ($c, $p) = ('cust_000001', '2031-12');
my $key = key_of($node, $c, $p);

# The request billguard made before the backup was restored.
my $body = q1($node, qq{
	SELECT billguard.charge_request_body('/v1/payment_intents', '$key', customer_id, '$p', amount_cents, currency,
	                                     stripe_customer, payment_method)
	  FROM billguard.accounts WHERE customer_id = '$c'});
my $earlier = $emulator->request('POST', '/v1/payment_intents', $body, idempotency_key => $key);
is($earlier->{status}, 200, 'the charge made before the backup was restored succeeded');
my $original = $earlier->{json}{id};
my $made = time;
sleep 0.1 while time - $made < $ttl + 0.5;    # Stripe has pruned the key

q1($node, qq{BEGIN;
	SELECT status FROM billguard.bill_customer('$c', '$p');
	UPDATE billguard.billing_records SET created_at = now() - interval '2 days' WHERE idempotency_key = '$key';
	COMMIT;});
ok(wait_for('the record settled', 30, sub { status_of($node, $c, $p) eq 'completed' }), 'the restored record completes');
is(scalar(@{ succeeded_for_key($emulator, $key) }), 1, 'exactly one charge for its key at the emulator');
is(q1($node, "SELECT charge_id FROM billguard.billing_records WHERE idempotency_key = '$key'"), $original,
	'the record carries the charge made before the restore');
is(event_types($node, $c, $p, 'action'), 'BillingInitiated,ChargeAttempted(search),ChargeReconciled',
	'it searched first and reconciled, sending no charge');

$node->stop;
$emulator->stop;
done_testing();
