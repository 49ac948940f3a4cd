# A 500 that created nothing: the record goes unknown, a search finds
# nothing, the charge is re-sent with the same key, and so on. Stripe
# replays a cached 500 for the key to every re-send, so billguard stops after
# billguard.max_unknown_cycles (3 here) indeterminate answers, each followed
# by a search that found nothing: the record needs review, never re-sent.
# Requests are counted at the emulator (its request log).
#
#   never     the first POST gets a 500 that created nothing, cached and
#             replayed to every re-send: after exactly 3 POSTs and 3
#             searches the record is needs_review (settled: out of the
#             queue, no lease), last_error and a NeedsReview event say why,
#             the server log says so; nothing is charged and nothing more
#             is sent; retry_record requeues it with its cycles counted
#             from 0 again
#   third     the first two POSTs get a 500 from before the endpoint
#             executes (nothing created, nothing saved), the third charges:
#             completed after 3 POSTs and 2 searches, exactly one charge
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep time);
use JSON::PP;
use BillguardTest;
use BillguardNode;

my $emulator_log = "$PostgreSQL::Test::Utils::log_path/127_emulator.log";
my $emulator = StripeEmulatorHarness->start(quiet => 0, stderr => $emulator_log);
my $node = BillguardNode->dispatching('unknown_cycles', $emulator,
	"billguard.max_unknown_cycles = 3",
	"billguard.search_settle_delay = '0'");
$node->add_accounts(2);
is($node->q1('SHOW billguard.max_unknown_cycles'), '3', 'max_unknown_cycles is set to 3');

# Charges (POST) and searches (GET .../search) in the emulator's request log.
sub requests_logged {
	my @lines = split /\n/, (eval { slurp_file($emulator_log) } // '');
	return (scalar(grep { m{^POST /v1/payment_intents } } @lines),
		scalar(grep { m{^GET /v1/payment_intents/search} } @lines));
}

# ---- never: every POST gets a 500 that created nothing --------------------------
{
	my ($c, $p) = ('cust_000001', '2031-01');
	my $key = $node->key_of($c, $p);
	my ($posts_before, $searches_before) = requests_logged();
	is($emulator->add_fault(kind => 'status', status => 500, count => 1, create => JSON::PP::false)->{json}{queued}, 1,
		'never: a 500 that creates nothing, saved for the key and replayed');
	is($node->bill($c, $p), 'initiated', 'never: billed');
	ok(wait_until('the record to settle', 60, sub { $node->status_of($c, $p) !~ /^(pending|dispatching|unknown)$/ }),
		'never: the record settles');
	is($node->status_of($c, $p), 'needs_review', 'never: it needs review');
	my ($posts, $searches) = requests_logged();
	is($posts - $posts_before, 3, 'never: exactly max_unknown_cycles (3) POSTs reached the emulator');
	is($searches - $searches_before, 3, 'never: and 3 searches, each of which found nothing');
	is(scalar(@{ ledger_for_key($emulator, $key) }), 0, 'never: no charge at the emulator');
	is($node->q1(qq{SELECT count(*) FILTER (WHERE event_type = 'ChargeUnknown') || ' ' || count(*) FILTER (WHERE event_type = 'NeedsReview')
		FROM billguard.journal WHERE persistence_id = 'billing-$c-$p'}), '3 1', 'never: three ChargeUnknown, one NeedsReview');
	my $review = $node->events_of($c, $p, 'NeedsReview')->[0];
	is($review->{via}, 'search', 'never: NeedsReview comes from the search');
	like($review->{message}, qr/^no charge found for the key after 3 indeterminate answers.*max_unknown_cycles/,
		'never: NeedsReview says why');
	ok($review->{request_id} && defined $review->{attempt}, 'never: with the search\'s request id and the attempt');
	like($node->q1("SELECT last_error FROM billguard.billing_records WHERE customer_id = '$c' AND billing_period = '$p'"),
		qr/^no charge found for the key after 3 indeterminate answers, each followed by a search \(max_unknown_cycles\)/,
		'never: last_error says why');
	is($node->q1(qq{SELECT (next_attempt_at IS NULL) || ' ' || (lease_expires_at IS NULL) || ' ' || unknown_cycles
		FROM billguard.billing_records WHERE customer_id = '$c' AND billing_period = '$p'}), 'true true 3',
		'never: settled (out of the queue, no lease), three cycles counted');
	like(slurp_file($node->logfile), qr/billguard dispatcher: \Q$c\/$p\E is needs_review: no charge found for the key after 3/,
		'never: the dispatcher logs it');
	my $requests = $emulator->stats->{requests};
	sleep 1.5;
	is($emulator->stats->{requests}, $requests, 'never: nothing more is sent');

	# An operator's retry starts the count again: three more cycles.
	is($node->q1("SELECT billguard.retry_record('$c', '$p')"), 'pending', 'never: retry_record requeues it');
	ok(wait_until('the retried record to settle', 60, sub { $node->status_of($c, $p) !~ /^(pending|dispatching|unknown)$/ }),
		'never: the retried record settles');
	my ($posts_after, $searches_after) = requests_logged();
	is($node->status_of($c, $p) . ' ' . ($posts_after - $posts) . ' ' . ($searches_after - $searches), 'needs_review 3 3',
		'never: after the retry, needs_review again after 3 more POSTs and 3 more searches');
	is(scalar(@{ ledger_for_key($emulator, $key) }), 0, 'never: still no charge');
}

# ---- third: the third cycle charges ----------------------------------------------
{
	my ($c, $p) = ('cust_000002', '2031-01');
	my $key = $node->key_of($c, $p);
	my ($posts_before, $searches_before) = requests_logged();
	is($emulator->add_fault(kind => 'status', status => 500, count => 2, executes => JSON::PP::false)->{json}{queued}, 2,
		'third: two 500s from before the endpoint executes (nothing created, nothing saved)');
	is($node->bill($c, $p), 'initiated', 'third: billed');
	ok(wait_until('the record to settle', 60, sub { $node->status_of($c, $p) !~ /^(pending|dispatching|unknown)$/ }),
		'third: the record settles');
	my $charges = succeeded_for_key($emulator, $key);
	is(scalar(@$charges), 1, 'third: exactly one charge at the emulator');
	is($node->record_of($c, $p), "completed|" . ($charges->[0]{id} // '') . "|3",
		'third: completed with that charge after three attempts');
	my ($posts, $searches) = requests_logged();
	is(($posts - $posts_before) . ' ' . ($searches - $searches_before), '3 2', 'third: 3 POSTs and 2 searches');
	is($node->event_types($c, $p),
		'BillingInitiated,ChargeAttempted,ChargeUnknown,ChargeAttempted,ChargeUnknown,ChargeAttempted,BillingCompleted',
		'third: unknown twice, then completed');
}

$node->stop;
$emulator->stop;
done_testing();
