# The real webhook loop: the Stripe emulator
# signs and delivers its webhooks to billguard-proxy's POST /webhooks/stripe,
# which passes them to ingest_stripe_event in the billing database, while
# the dispatcher charges the emulator:
#   - a 500 that created the charge leaves the record unknown; the dispatcher
#     would search only after an hour (search_settle_delay), and the webhook
#     resolves it first: completed with the emulator's charge, one charge,
#     no search; a caller in await_billing is answered by that commit;
#   - every event delivered three times, and one resent later: applied once;
#   - a refund in "Stripe's dashboard" after completion: recorded, partly
#     then fully, the record stays completed;
#   - kill -9 of the proxy with deliveries pending: the emulator retries
#     until the restarted proxy answers, and each event is applied once;
#   - a connected account's record behind a 500: its events come from the
#     emulator's Connect endpoint, signed with that endpoint's own secret
#     (both secrets in billguard.webhook_secret_file), and complete it.
use strict;
use warnings;
use File::Temp qw(tempdir);
use PostgreSQL::Test::Utils;
use Test::More;
use SecretFile qw(write_secret_file);
use IPC::Run;
use JSON::PP;
use BillguardTest;
use BillguardNode;
use ProxyHarness;
use StripeWebhook;

my $secret = 'whsec_183loopSecretAbcdefghij01234';
my $secret_file = write_secret_file(tempdir(CLEANUP => 1) . '/webhook.secret', $secret);
my $emulator = start_emulator();
my $node = BillguardNode->dispatching('webhook_loop', $emulator, "billguard.webhook_secret_file = '$secret_file'",
	"billguard.search_settle_delay = '1h'");
$node->add_accounts(4);
$node->q1('CREATE ROLE billing_webhooks LOGIN; GRANT USAGE ON SCHEMA billguard TO billing_webhooks; '
	. 'GRANT EXECUTE ON FUNCTION billguard.ingest_stripe_event(text, text) TO billing_webhooks');
my $proxy = ProxyHarness->start(conninfo => $node->connstr('postgres'), upstream => $emulator,
	args => [ '--webhook-database', $node->connstr('postgres') . ' user=billing_webhooks' ]);
my $hooks = $emulator->control(POST => '/_emulator/webhooks',
	{ url => $proxy->url('/webhooks/stripe'), secret => $secret, hold => JSON::PP::true, retry_ms => 100 });
is($hooks->{status}, 200, 'the emulator delivers its webhooks to the proxy (held for now)');

sub webhooks { return $emulator->control(GET => '/_emulator/webhooks')->{json} }
sub hold { my ($on) = @_; $emulator->control(POST => '/_emulator/webhooks', { hold => $on ? JSON::PP::true : JSON::PP::false }) }
sub all_delivered {
	my ($what) = @_;
	return wait_until($what, 60, sub { my $w = webhooks(); @{ $w->{deliveries} } && $w->{pending} == 0 });
}
sub effects {
	my ($customer) = @_;
	return $node->q1(qq{SELECT string_agg(event_type || '=' || effect, ' ' ORDER BY received_at, event_id)
	                     FROM billguard.stripe_events WHERE customer_id = '$customer'});
}

# ---- an unknown record, resolved by the webhook before any search -----------------------

$emulator->add_fault(kind => 'status', status => 500, count => 1);
is($node->bill('cust_000001', '2026-08'), 'initiated', 'cust_000001 billed');
ok(wait_until('the record to be unknown', 30, sub { $node->status_of('cust_000001', '2026-08') eq 'unknown' }),
	'the emulator answered 500 (having charged): the record is unknown');
my $key = $node->key_of('cust_000001', '2026-08');
my $charges = succeeded_for_key($emulator, $key);
is(scalar(@$charges), 1, 'the emulator holds one charge for the key');
my $waiter = { out => '', err => '' };
$waiter->{handle} = IPC::Run::start([ 'psql', '-XAtq', '-d', $node->connstr('postgres'), '-c',
	q{SELECT status || '|' || charge_id FROM billguard.await_billing('cust_000001', '2026-08', '1 hour')} ],
	'>', \$waiter->{out}, '2>', \$waiter->{err});
ok(wait_until('the caller to wait', 30, sub {
	$node->q1(q{SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Extension' AND query LIKE '%await_billing%'}) eq '1' }),
	'a caller waits in await_billing');
my $requests = $emulator->stats->{requests};
hold(0);
ok(all_delivered('the webhooks to be delivered'), 'released, every webhook is delivered (2xx from the proxy)');
is($node->record_of('cust_000001', '2026-08'), "completed|$charges->[0]{id}|1",
	'the webhook completed the record with the emulator\'s charge');
is($node->event_types('cust_000001', '2026-08', 'effect'),
	'BillingInitiated,ChargeAttempted,ChargeUnknown,WebhookApplied(completed),WebhookApplied(confirmed)',
	'journal: the 500, then payment_intent.succeeded completed it and charge.succeeded confirmed it');
is(effects('cust_000001'), 'payment_intent.succeeded=completed charge.succeeded=confirmed',
	'stripe_events holds both (payment_intent.created is ignored)');
is($emulator->stats->{requests}, $requests, 'the dispatcher sent nothing more: no search, no second charge');
ok(wait_until('the waiting caller', 30, sub { !still_running($waiter->{handle}) }),
	'the caller in await_billing is answered by the webhook\'s commit');
$waiter->{handle}->finish;
is($waiter->{out}, "completed|$charges->[0]{id}\n", '... with the charge');

# ---- at least once: applied once ---------------------------------------------------------

$emulator->control(POST => '/_emulator/webhooks', { duplicate => 2, hold => JSON::PP::true });
my $delivered_before = scalar @{ webhooks()->{deliveries} };
is($node->bill('cust_000002', '2026-08'), 'initiated', 'cust_000002 billed, its webhooks held');
ok($node->wait_until_settled('2026-08'), 'the dispatcher completes it');
hold(0);
ok(all_delivered('the triplicated webhooks'), 'released: every delivery answered 2xx');
my %copies;
$copies{ $_->{event_id} }++ for @{ webhooks()->{deliveries} }[ $delivered_before .. $#{ webhooks()->{deliveries} } ];
is(join(' ', sort values %copies), '3 3 3', 'each of its three events was delivered three times');
is(effects('cust_000002'), 'payment_intent.succeeded=confirmed charge.succeeded=confirmed',
	'and applied once: confirmed, as the dispatcher had recorded it');
$emulator->control(POST => '/_emulator/webhooks', { duplicate => 0 });
my ($old) = grep { $_->{type} eq 'payment_intent.succeeded' } @{ webhooks()->{deliveries} };
$emulator->control(POST => '/_emulator/webhooks/resend', { event_id => $old->{event_id} });
ok(all_delivered('the resent event'), 'an old event resent: answered 2xx (already seen)');
is($node->q1('SELECT count(*) FROM billguard.stripe_events'), '4', 'nothing new was applied');

# ---- a refund after completion -------------------------------------------------------------

my $pi = $charges->[0]{id};
is($emulator->control(POST => '/_emulator/refunds', { id => $pi, amount => 300 })->{status}, 200,
	'300 cents of cust_000001\'s charge refunded in "Stripe\'s dashboard"');
ok(all_delivered('charge.refunded'), 'charge.refunded delivered');
is($emulator->control(POST => '/_emulator/refunds', { id => $pi })->{status}, 200, 'then the rest');
ok(all_delivered('the second charge.refunded'), 'delivered');
is($node->q1(q{SELECT string_agg(effect || ' ' || amount_refunded_cents, ', ' ORDER BY received_at)
               FROM billguard.stripe_events WHERE customer_id = 'cust_000001' AND event_type = 'charge.refunded'}),
	'refunded 300, refunded 1001', 'both refunds are recorded with the amount refunded so far');
is($node->record_of('cust_000001', '2026-08'), "completed|$pi|1", 'the record stays completed with its charge');
is($node->q1(q{SELECT billguard.entity_state('billing-cust_000001-2026-08') ->> 'refunded_cents'}), '1001',
	'entity_state: 1001 cents refunded');
is($node->q1("SELECT status FROM billguard.bill_customer('cust_000001', '2026-08')"), 'already_completed',
	'the period is never billed again');

# ---- kill -9 of the proxy with deliveries pending ------------------------------------------------

hold(1);
$emulator->add_fault(kind => 'status', status => 500, count => 1);
is($node->bill('cust_000003', '2026-08'), 'initiated', 'cust_000003 billed behind another 500');
ok(wait_until('the record to be unknown', 30, sub { $node->status_of('cust_000003', '2026-08') eq 'unknown' }),
	'unknown, its webhooks held');
$proxy->stop('KILL');
hold(0);
ok(wait_until('deliveries to fail against the dead proxy', 30, sub {
	grep { $_->{attempts} >= 2 && !$_->{delivered} } @{ webhooks()->{deliveries} } }),
	'with the proxy killed, the emulator retries its deliveries');
is($node->status_of('cust_000003', '2026-08'), 'unknown', 'and the record is still unknown');
$proxy->restart;
ok(all_delivered('the retried webhooks'), 'the proxy restarted, every delivery is answered 2xx');
my $charge3 = succeeded_for_key($emulator, $node->key_of('cust_000003', '2026-08'));
is($node->record_of('cust_000003', '2026-08'), "completed|$charge3->[0]{id}|1",
	'the record is completed with the emulator\'s charge');
is(effects('cust_000003'), 'payment_intent.succeeded=completed charge.succeeded=confirmed', 'each event applied once');

# ---- a connected account's record, resolved by its Connect endpoint's webhook -------------

# The platform's Connect endpoint has its own secret: both in the one file.
my $connect_secret = 'whsec_183connectEndpointAbcdefgh012';
write_secret_file($secret_file, "$secret\n$connect_secret\n");
$node->q1(q{INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method, stripe_account)
            VALUES ('cust_connect', 'cus_000001', 1500, 'usd', 'pm_card_visa', 'acct_183Connected')});
$emulator->control(POST => '/_emulator/webhooks',
	{ connect_url => $proxy->url('/webhooks/stripe'), connect_secret => $connect_secret, hold => JSON::PP::true });
$emulator->add_fault(kind => 'status', status => 500, count => 1);
is($node->bill('cust_connect', '2026-08'), 'initiated', 'cust_connect (on acct_183Connected) billed behind a 500');
ok(wait_until('the record to be unknown', 30, sub { $node->status_of('cust_connect', '2026-08') eq 'unknown' }),
	'unknown, its webhooks held');
my $connect_charge = succeeded_for_key($emulator, $node->key_of('cust_connect', '2026-08'));
is(join(',', map { $_->{account} } @$connect_charge), 'acct_183Connected', 'its one charge is on acct_183Connected');
hold(0);
ok(all_delivered('the Connect endpoint\'s webhooks'), 'released: delivered from the Connect endpoint');
is(join(' ', map { $_->{endpoint} } grep { $_->{object_id} eq $connect_charge->[0]{id} } @{ webhooks()->{deliveries} }),
	'connect connect', 'the PaymentIntent\'s events came from the Connect endpoint, signed with its secret');
is($node->record_of('cust_connect', '2026-08'), "completed|$connect_charge->[0]{id}|1",
	'the event of acct_183Connected completed the record of acct_183Connected');
is(effects('cust_connect'), 'payment_intent.succeeded=completed charge.succeeded=confirmed', 'each applied once');

my $by_key = charges_by_key($emulator);
is(scalar(grep { @{ $by_key->{$_} } != 1 } keys %$by_key), 0, 'exactly one charge per key at the emulator');
unlike($proxy->log_text, qr/\Q$secret\E|\Q$connect_secret\E/, 'no webhook secret ever reached the proxy');

$node->stop;
done_testing();
