# Answers no Stripe would send, from a raw HTTP server standing in for it:
# a number jsonb cannot hold (1e1000000), a million nested arrays, a 3 MiB
# body, bytes that are not UTF-8, an escaped NUL, HTML where JSON belongs.
# No answer may stop the dispatcher: its pid never changes, and every
# record ends in a sensible state (an unreadable success needs review, an
# unreadable decline fails, an unreadable 500 is unknown), with Stripe's
# Request-Id on its journal event and the unreadable body kept as text.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use BillguardTest;
use BillguardNode;
use RawHttpServer;

# customer => [status, body]; searches find nothing.
my %answers = (
	hostile_number => [200, '{"id":"pi_number","object":"payment_intent","status":"succeeded","amount":1e1000000}'],
	hostile_deep   => [200, '[' x 1_000_000],
	hostile_huge   => [200, '{"id":"pi_huge","object":"payment_intent","status":"succeeded","pad":"' . ('x' x (3 << 20)) . '"}'],
	hostile_utf8   => [402, qq({"error":{"type":"card_error","code":"card_declined","message":"d\xff\xfe"}})],
	hostile_nul    => [400, '{"error":{"type":"invalid_request_error","message":"bad \u0000 param"}}'],
	hostile_html   => [500, '<html><body>Internal error</body></html>'],
	hostile_fine   => [200, '{"id":"pi_fine","object":"payment_intent","status":"succeeded"}'],
);

# Stripe's stand-in answers by the customer in the request body; a search
# (GET) finds nothing.
my $stripe = RawHttpServer->start(sub {
	my ($head, $body) = @_;
	my ($customer) = $body =~ /metadata%5Bcustomer_id%5D=([^&]*)/;
	my ($status, $answer) = $head =~ m{^GET }
	  ? (200, '{"object":"search_result","data":[]}')
	  : @{ $answers{ $customer // '' } // [404, '{}'] };
	return ($status, $answer, 'req_' . ($customer // 'search'));
});
my $node = BillguardNode->dispatching('hostile', $stripe, "billguard.search_settle_delay = '1h'");
$node->q1(q{INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method)
	SELECT c, 'cus_' || c, 1000, 'usd', 'pm_card_visa'
	  FROM unnest(ARRAY['} . join("','", sort keys %answers) . q{']) c});
my $pid = $node->wait_for_new_dispatcher(undef, 20);
ok($pid, "a dispatcher runs (pid $pid)");
is($node->q1("SELECT initiated FROM billguard.bill_period('2031-05')"), scalar(keys %answers), 'every account billed');

my %expected = (
	hostile_number => 'needs_review', hostile_deep => 'needs_review', hostile_huge => 'needs_review',
	hostile_utf8 => 'failed', hostile_nul => 'failed', hostile_html => 'unknown', hostile_fine => 'completed');
my $states = sub {
	return $node->q1(q{SELECT string_agg(customer_id || '=' || status, ',' ORDER BY customer_id)
		FROM billguard.billing_records WHERE billing_period = '2031-05'});
};
my $want = join(',', map { "$_=$expected{$_}" } sort keys %expected);
ok(wait_until('every record in its expected state', 60, sub { $states->() eq $want }),
	'every record ends in a sensible state') or diag('states: ' . $states->());
is($node->dispatcher_pid, $pid, 'the dispatcher never restarted (same pid)');
unlike(slurp_file($node->logfile), qr/background worker "billguard dispatcher" \(PID \d+\) exited/,
	'the server log shows no dispatcher exit');

my $event = sub {
	my ($customer, $type) = @_;
	return $node->events_of($customer, '2031-05', $type)->[0] // {};
};
is($event->('hostile_fine', 'BillingCompleted')->{charge_id}, 'pi_fine', 'a readable answer completes with its id');
is($event->('hostile_number', 'NeedsReview')->{message}, 'success response without an object id',
	'a success whose body jsonb cannot hold needs review');
like($event->('hostile_number', 'NeedsReview')->{body} // '', qr/^\{"id":"pi_number".*1e1000000/,
	'... and its body is kept as text, for people');
cmp_ok(length($event->('hostile_huge', 'NeedsReview')->{body} // ''), '<=', 500, 'a 3 MiB body is kept capped');
is($event->('hostile_utf8', 'BillingFailed')->{http_status}, 402, 'a decline that is not UTF-8 fails (402)');
like($event->('hostile_utf8', 'BillingFailed')->{body} // '', qr/^\{"error".*d\?\?/, '... its body kept printable');
is($event->('hostile_nul', 'BillingFailed')->{message}, 'bad ? param', 'an escaped NUL is kept as ?');
is($event->('hostile_html', 'ChargeUnknown')->{http_status}, 500, 'an HTML 500 is unknown');
is(join(',', map { $event->($_->[0], $_->[1])->{request_id} // '-' }
		[ 'hostile_fine', 'BillingCompleted' ], [ 'hostile_number', 'NeedsReview' ],
		[ 'hostile_utf8', 'BillingFailed' ], [ 'hostile_html', 'ChargeUnknown' ]),
	'req_hostile_fine,req_hostile_number,req_hostile_utf8,req_hostile_html',
	"every event carries the answer's Request-Id");

$node->stop;
$stripe->stop;
done_testing();
