# Stripe Connect: two connected accounts and the platform bill a customer
# with the same Stripe customer id (cus_same on each: a customer object
# lives on one account, so each account has its own cus_same). The three
# billguard customers are cust_platform (stripe_account NULL), cust_conn_a
# (acct_131A) and cust_conn_b (acct_131B): customer_id is the accounts'
# primary key and one of a key's three parts, so three keys.
#   - one period billed: three charges at the emulator, each on its own
#     account, none twice, acct_131A's with its application fee, each
#     record completed with its own account's charge;
#   - kill -9 of the dispatcher while the three charges are in flight: each
#     is re-sent with its key on its account only (one object per key, on
#     the record's account), and completes as a replay;
#   - a 500 that made the charge on acct_131A: the search for it goes to
#     acct_131A (a search on the platform finds nothing there, and the
#     record would end needs_review) and completes the record;
#   - a customer's connected account does not change while one of its
#     records may still be sent;
#   - a connected account whose access was revoked (Stripe's 403 "does
#     not have access to account"): its record fails with Stripe's word,
#     the other accounts' records complete, the dispatcher is not paused;
#   - webhooks per account, from two endpoints (the account endpoint's and
#     the Connect endpoint's secrets in one billguard.webhook_secret_file):
#     an event of one account naming another's
#     record (its key, amount, currency and customer), or the platform's
#     naming a connected account's, is a mismatch and completes nothing;
#     each account's own event completes its own record.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use JSON::PP;
use BillguardTest;
use BillguardNode;
use SecretFile qw(write_secret_file);
use StripeWebhook;

# The platform's account endpoint and its Connect endpoint, each with its
# own signing secret, one a line in the one secret file.
my $secret = 'whsec_131accountEndpointAbcdefgh01';
my $connect_secret = 'whsec_131connectEndpointAbcdefgh02';
my $secret_file = write_secret_file(PostgreSQL::Test::Utils::tempdir() . '/webhook.secret',
	"$secret\n$connect_secret\n");
my $emulator = start_emulator();
my $node = BillguardNode->dispatching('connect_accounts', $emulator,
	"billguard.webhook_secret_file = '$secret_file'", "billguard.search_settle_delay = '1s'",
	'restart_after_crash = on');

my %account_of = (cust_platform => undef, cust_conn_a => 'acct_131A', cust_conn_b => 'acct_131B');
my @customers = sort keys %account_of;
$node->q1(q{
	INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method, stripe_account,
	                                application_fee_cents)
	VALUES ('cust_platform', 'cus_same', 2000, 'usd', 'pm_card_visa', NULL, NULL),
	       ('cust_conn_a', 'cus_same', 2000, 'usd', 'pm_card_visa', 'acct_131A', 150),
	       ('cust_conn_b', 'cus_same', 2000, 'usd', 'pm_card_visa', 'acct_131B', NULL)});
# The platform's fee on each charge of acct_131A; none on acct_131B's.
my %fee_of = (cust_platform => undef, cust_conn_a => 150, cust_conn_b => undef);

sub shown { my ($account) = @_; return $account // 'the platform' }

# For each customer's record of $period: its key has exactly one object at
# the emulator (on any account, in any status), succeeded, on the record's
# account, and the record completed with it.
sub charged_once_on_own_account {
	my ($label, $period) = @_;
	my $ledger = $emulator->ledger;
	for my $customer (@customers) {
		my $key = $node->key_of($customer, $period);
		my @objects = @{ ledger_for_key($emulator, $key) };
		is(scalar(@objects), 1, "$label: $customer: one object for its key at the emulator") or next;
		is(shown($objects[0]{account}), shown($account_of{$customer}), "$label: $customer: ... on its own account");
		is($objects[0]{status}, 'succeeded', "$label: $customer: ... succeeded");
		is($objects[0]{customer}, 'cus_same', "$label: $customer: ... of cus_same");
		is($objects[0]{application_fee_amount}, $fee_of{$customer},
			"$label: $customer: ... application_fee_amount " . ($fee_of{$customer} // 'none'));
		is($node->record_of($customer, $period) =~ s/\|\d+$//r, "completed|$objects[0]{id}",
			"$label: $customer: the record is completed with that charge");
	}
	my %accounts = map { (shown($_->{account}) => 1) } grep { ($_->{metadata}{billing_period} // '') eq $period } @$ledger;
	is(join(',', sort keys %accounts), 'acct_131A,acct_131B,the platform', "$label: three charges, each on its own account");
}

# ---- one period -----------------------------------------------------------------------

is($node->q1("SELECT initiated FROM billguard.bill_period('2031-01')"), '3', '2031-01: three records claimed');
is($node->q1(q{SELECT string_agg(customer_id || '=' || coalesce(stripe_account, 'platform'), ' ' ORDER BY customer_id)
               FROM billguard.billing_records WHERE billing_period = '2031-01'}),
	'cust_conn_a=acct_131A cust_conn_b=acct_131B cust_platform=platform', '... each froze its account');
ok($node->wait_until_settled('2031-01'), '2031-01 settles');
charged_once_on_own_account('2031-01', '2031-01');
is($node->q1("SELECT initiated FROM billguard.bill_period('2031-01')"), '0', 'billing the period again claims nothing');

# ---- kill -9 of the dispatcher with the three charges in flight -----------------------

$emulator->configure(latency_ms => 2500);
is($node->q1("SELECT initiated FROM billguard.bill_period('2031-02')"), '3', '2031-02: three records claimed');
ok(wait_until('three charges in flight at the emulator', 30, sub { $emulator->stats->{in_progress} >= 3 }),
	'the three charges are in flight');
my $old = $node->dispatcher_pid;
kill('KILL', $old) or die "kill -9 $old: $!";
ok($node->wait_for_new_dispatcher($old, 60), 'kill -9 of the dispatcher mid-send: another one runs');
$emulator->configure(latency_ms => 0);
ok($node->wait_until_settled('2031-02'), '2031-02 settles after the crash');
charged_once_on_own_account('after kill -9', '2031-02');
for my $customer (@customers) {
	my $completed = $node->events_of($customer, '2031-02', 'BillingCompleted');
	ok(@$completed && $completed->[-1]{replayed}, "after kill -9: $customer completed as a replay of its first charge")
	  or diag(explain($completed));
}

# ---- a 500 that made the charge: the search goes to the record's account --------------

$emulator->add_fault(kind => 'status', status => 500, count => 1);
is($node->bill('cust_conn_a', '2031-03'), 'initiated', '2031-03: cust_conn_a billed alone, behind a 500 that charged');
ok(wait_until('cust_conn_a/2031-03 completed', 60, sub { $node->status_of('cust_conn_a', '2031-03') eq 'completed' },
	explain => sub { $node->record_of('cust_conn_a', '2031-03') }), 'the record completes');
my $key = $node->key_of('cust_conn_a', '2031-03');
my @behind_500 = @{ ledger_for_key($emulator, $key) };
is(scalar(@behind_500), 1, 'one object for its key ...');
is(shown($behind_500[0]{account}), 'acct_131A', '... on acct_131A, where the search found it');
is($node->record_of('cust_conn_a', '2031-03') =~ s/\|\d+$//r, "completed|$behind_500[0]{id}",
	'the record is completed with the charge made behind the 500');
like($node->event_types('cust_conn_a', '2031-03'), qr/ChargeUnknown,.*ChargeReconciled$/,
	'an unknown result, then reconciled by the search');

# ---- a connected account that refuses the platform: its records fail, the others bill ----

$node->q1(q{INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method, stripe_account)
            VALUES ('cust_conn_revoked', 'cus_same', 2000, 'usd', 'pm_card_visa', 'acct_131Revoked')});
$emulator->configure(refused_accounts => ['acct_131Revoked']);
is($node->q1("SELECT initiated FROM billguard.bill_period('2031-05')"), '4', '2031-05: four records claimed');
ok($node->wait_until_settled('2031-05'), '2031-05 settles');
is($node->statuses_of('2031-05'), 'completed=3, failed=1', 'three completed, one failed');
is($node->status_of('cust_conn_revoked', '2031-05'), 'failed', 'the revoked account\'s record failed');
like($node->q1("SELECT last_error FROM billguard.billing_records WHERE customer_id = 'cust_conn_revoked' AND billing_period = '2031-05'"),
	qr/does not have access to account 'acct_131Revoked'/, '... with Stripe\'s word');
is(scalar(@{ ledger_for_key($emulator, $node->key_of('cust_conn_revoked', '2031-05')) }), 0, '... and nothing charged');
is($node->q1('SELECT paused FROM billguard.dispatch_status'), 'f', 'the dispatcher is not paused by one account');
$emulator->configure(refused_accounts => []);
$node->q1("UPDATE billguard.accounts SET active = false WHERE customer_id = 'cust_conn_revoked'");

# ---- webhooks per account ---------------------------------------------------------------

# Three records of 2031-04 the dispatcher leaves alone, unknown as after a
# cached 500: a webhook is what settles them.
$node->q1(q{
	BEGIN;
	SELECT initiated FROM billguard.bill_period('2031-04');
	UPDATE billguard.billing_records SET status = 'unknown', attempts = 1, first_dispatched_at = now(),
	       next_attempt_at = now() + interval '1 day'
	 WHERE billing_period = '2031-04';
	COMMIT});
is($node->statuses_of('2031-04'), 'unknown=3', '2031-04: three unknown records');

# ---- the connected account is frozen while a record may still be sent ----------------

my ($rc, $out, $err) = $node->psql('postgres',
	"UPDATE billguard.accounts SET stripe_account = 'acct_131B' WHERE customer_id = 'cust_conn_a'");
isnt($rc, 0, 'moving a customer with a record in flight to another connected account is refused');
like($err, qr/account 'cust_conn_a' has a billing record in flight \(2031-04, key \w+, unknown\)/,
	'... naming the customer and the record');
is($node->q1("SELECT stripe_account FROM billguard.accounts WHERE customer_id = 'cust_conn_a'"), 'acct_131A',
	'... and nothing changed');
($rc, $out, $err) = $node->psql('postgres', q{UPDATE billguard.billing_records SET stripe_account = 'acct_131B'
                                              WHERE customer_id = 'cust_conn_a' AND billing_period = '2031-04'});
isnt($rc, 0, 'the record\'s own stripe_account is frozen with its request: changing it is refused');
is($node->q1(q{SELECT stripe_account FROM billguard.billing_records WHERE customer_id = 'cust_conn_a' AND billing_period = '2031-04'}),
	'acct_131A', '... and nothing changed');

my $event_number = 0;
# payment_intent.succeeded from $from (an acct_ id, or undef: the platform)
# about a PaymentIntent carrying $customer's 2031-04 key, amount and Stripe customer.
sub succeeded_event {
	my ($from, $customer) = @_;
	my $n = ++$event_number;
	return stripe_event(id => "evt_131_$n", type => 'payment_intent.succeeded', defined $from ? (account => $from) : (),
		object => { id => "pi_131_$n", object => 'payment_intent', amount => 2000, currency => 'usd',
			customer => 'cus_same', status => 'succeeded', metadata => { billguard_key => $node->key_of($customer, '2031-04') } });
}
# A delivery signed as the endpoint that hears it signs it: a connected
# account's event by the Connect endpoint, the platform's by the account one.
sub deliver {
	my ($payload) = @_;
	my $signed_with = decode_json($payload)->{account} ? $connect_secret : $secret;
	my ($rc, $out, $err) = $node->psql('postgres', q{SELECT billguard.ingest_stripe_event(:'payload', :'header')},
		extra_params => [ '-v', "payload=$payload", '-v', 'header=' . webhook_signature($payload, time, $signed_with) ]);
	return $rc == 0 ? $out : $err;
}

my @crossed = (
	[ 'acct_131A', 'cust_platform', 'connected account acct_131A', 'the platform\'s own account' ],
	[ 'acct_131A', 'cust_conn_b',   'connected account acct_131A', 'connected account acct_131B' ],
	[ 'acct_131B', 'cust_conn_a',   'connected account acct_131B', 'connected account acct_131A' ],
	[ undef,       'cust_conn_a',   'the platform\'s own account', 'connected account acct_131A' ],
	[ undef,       'cust_conn_b',   'the platform\'s own account', 'connected account acct_131B' ],
);
for my $case (@crossed) {
	my ($from, $customer, $from_text, $record_text) = @$case;
	is(deliver(succeeded_event($from, $customer)), 'mismatch', 'an event of ' . shown($from) . " naming $customer\'s record: mismatch");
	like(slurp_file($node->logfile), qr/changed nothing: the event comes from \Q$from_text\E, the record's charge is made on \Q$record_text\E/,
		'... logged, naming both accounts');
}
is($node->statuses_of('2031-04'), 'unknown=3', 'no record completed by another account\'s event');
for my $customer (@customers) {
	is(deliver(succeeded_event($account_of{$customer}, $customer)), 'completed',
		shown($account_of{$customer}) . "'s own event completes $customer\'s record");
}
is($node->q1(q{SELECT string_agg(effect || '=' || n, ' ' ORDER BY effect)
               FROM (SELECT effect, count(*) n FROM billguard.stripe_events GROUP BY 1) e}),
	'completed=3 mismatch=5', 'stripe_events: three completed, five mismatches');

$node->stop;
$emulator->stop;
done_testing();
