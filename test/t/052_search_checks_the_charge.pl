# A search that trusts the key alone. Two billing databases, one Stripe
# account (one emulator), both with the default key namespace and an
# account with the same customer id, cust_000001, but different Stripe
# customers: the same content-hash key for the same period. (Two databases
# of one server with one namespace are refused by the launcher; two servers
# cannot see each other, so the search must check what it finds.)
#   - A bills 2026-09: cus_A charged with the key;
#   - B's record reaches the search path (claimed longer than its
#     idempotency window ago, 1 s here: a lost answer, a restored backup).
#     The search finds A's charge by the key: its customer is cus_A, not
#     cus_B, so B's record is needs_review, with what differed in
#     last_error, a NeedsReview event naming the object and a WARNING; it
#     is never completed with A's charge (before, it was, and cus_B was
#     never charged).
#   - requeued, it searches again and is needs_review again: a person
#     charges cus_B and resolves the record (resolve_record).
# That a search among several objects with the key takes the one that is
# the record's charge is test/pgtap/10_dispatch_queue.sql's.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);
use BillguardTest;
use BillguardNode;

my $emulator = start_emulator(idempotency_ttl => 2);
my $a = BillguardNode->dispatching('search_checks_a', $emulator);
my $b = BillguardNode->dispatching('search_checks_b', $emulator, "billguard.idempotency_window = '1s'");
my ($customer, $period) = ('cust_000001', '2026-09');
for ([ $a, 'cus_A' ], [ $b, 'cus_B' ]) {
	my ($node, $stripe_customer) = @$_;
	$node->q1(qq{INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method)
		VALUES ('$customer', '$stripe_customer', 4900, 'usd', 'pm_card_visa')});
}
my $key = $a->key_of($customer, $period);
is($b->key_of($customer, $period), $key, 'both databases make the same key for cust_000001 in 2026-09');

# ---- A bills ------------------------------------------------------------------------------

is($a->bill($customer, $period), 'initiated', 'A bills cust_000001');
ok(wait_until('A completed', 30, sub { $a->status_of($customer, $period) eq 'completed' }), "A's record completes");
my $theirs = $a->q1("SELECT charge_id FROM billguard.billing_records WHERE customer_id = '$customer'");
is(join(',', map { $_->{customer} } @{ succeeded_for_key($emulator, $key) }), 'cus_A', 'cus_A is charged with the key');

# ---- B's record is searched for -----------------------------------------------------------

$b->reload_with(api_key_file => $b->basedir . '/missing.key');
ok(wait_until('B paused', 20, sub { $b->q1('SELECT paused FROM billguard.dispatch_status') eq 't' }), 'B is paused');
is($b->bill($customer, $period), 'initiated', 'B bills its cust_000001, not sent yet');
sleep 2.5;    # past B's idempotency window, and past the emulator's memory of A's key
my $offset = -s $b->logfile;
$b->reload_with(api_key_file => $b->basedir . '/stripe.key');
ok(wait_until('B settled', 30, sub { $b->status_of($customer, $period) eq 'needs_review' }),
	"B's record is needs_review") or diag($b->record_of($customer, $period));
is($b->event_types($customer, $period, 'action'), 'BillingInitiated,ChargeAttempted(search),NeedsReview',
	'B searched first (claimed past its window), and found no charge of its own');
is($b->q1("SELECT coalesce(charge_id, 'none') FROM billguard.billing_records WHERE customer_id = '$customer'"), 'none',
	"B's record does not carry A's charge");
is($b->q1("SELECT last_error FROM billguard.billing_records WHERE customer_id = '$customer'"),
	"search found $theirs with the record's key, but for 4900 usd of customer cus_A, not the record's 4900 usd of "
	  . 'cus_B: another database or system bills with this key namespace on this Stripe account',
	'last_error says what differed');
is($b->q1(qq{SELECT (event ->> 'via') || ' ' || (event -> 'found' -> 0 ->> 'id') || ' ' || (event -> 'found' -> 0 ->> 'customer')
	FROM billguard.journal WHERE persistence_id = 'billing-$customer-$period' AND event_type = 'NeedsReview'}),
	"search $theirs cus_A", 'the NeedsReview event names the object found');
like(substr(slurp_file($b->logfile), $offset),
	qr/WARNING:  billguard dispatcher: cust_000001\/2026-09 is needs_review: search found \Q$theirs\E with the record's key/,
	'the server log says so as a WARNING');
is(join(',', map { $_->{customer} } @{ succeeded_for_key($emulator, $key) }), 'cus_A',
	'still one charge for the key, cus_A\'s');
is($a->status_of($customer, $period), 'completed', "A's record is untouched");

# ---- requeued, the same; a person charges and resolves it ------------------------------------

is($b->q1("SELECT billguard.retry_record('$customer', '$period')"), 'pending', 'an operator requeues B\'s record');
ok(wait_until('B reviewed again', 30, sub {
	$b->q1(qq{SELECT count(*) FROM billguard.journal WHERE persistence_id = 'billing-$customer-$period'
		AND event_type = 'NeedsReview'}) eq '2' }),
	'it searches again and is needs_review again: A\'s charge is still not B\'s');
is($b->status_of($customer, $period), 'needs_review', 'never completed with A\'s charge');
is(join(',', map { $_->{customer} } @{ succeeded_for_key($emulator, $key) }), 'cus_A', 'and nothing was charged');
my $by_hand = $emulator->post_form('/v1/payment_intents',
	StripeEmulatorHarness::payment_intent_params(customer => 'cus_B', amount => 4900));
is($b->q1("SELECT billguard.resolve_record('$customer', '$period', '$by_hand->{json}{id}')"), 'completed',
	'a person charges cus_B in Stripe and resolves the record with that charge');

$a->stop;
$b->stop;
$emulator->stop;
done_testing();
