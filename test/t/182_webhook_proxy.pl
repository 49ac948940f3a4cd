# billguard-proxy's POST /webhooks/stripe, Stripe's webhook endpoint:
# Stripe's deliveries, signed here by openssl, reach ingest_stripe_event in
# the billing database through a role holding only the webhook grants of
# docs/privileges.md, with no vault key:
#   - applied: 200 {"received": true, "result": ...}, the record changed;
#     the same delivery again: 200 already_seen; bytes the proxy might
#     "normalise" (non-ASCII, newlines, spacing) reach the database exactly;
#   - not signed by Stripe, no Stripe-Signature, not an event: 400
#     webhook_rejected; a key no record holds: 404; nothing changed;
#   - no usable webhook secret in the database: 500 (Stripe retries), the
#     reason in the proxy's log; fixed, the retry is applied;
#   - the database down: 503, then the same process applies the retry;
#   - a record another session keeps locked: 500 after the lock wait gives
#     up (Stripe retries), and the proxy's connection serves the next one;
#   - the proxy refuses to start with a webhook role lacking the grants, and
#     serves no /webhooks/stripe without --webhook-database.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use SecretFile qw(write_secret_file);
use IPC::Run;
use JSON::PP;
use BillguardTest;
use BillguardNode;
use ProxyHarness;
use StripeWebhook;

my $secret = 'whsec_182proxySecretAbcdefghij0123';
my $secret_file;
my $node = BillguardNode->preloaded('webhook_proxy', sub {
	my ($n) = @_;
	$secret_file = write_secret_file($n->basedir . '/webhook.secret', $secret);
	return ("billguard.webhook_secret_file = '$secret_file'");
});
$node->add_accounts(3);
is($node->q1("SELECT initiated FROM billguard.bill_period('2026-08')"), '3', 'three records claimed');
$node->q1(q{UPDATE billguard.billing_records SET status = 'unknown', attempts = 1, first_dispatched_at = now()});

# The webhook role, with exactly the grants of docs/privileges.md.
my $doc = slurp_file("$ENV{BILLGUARD_ROOT}/docs/privileges.md");
my ($grants) = $doc =~ /^## The grants\n.*?^```sql\n(.*?)^```\n/ms;
my ($webhook_grants) = ($grants // '') =~ /^(GRANT USAGE ON SCHEMA billguard TO billing_webhooks;.*?TO billing_webhooks;\n)/ms;
ok(defined $webhook_grants, 'docs/privileges.md lists the billing_webhooks grants');
$node->q1("CREATE ROLE billing_webhooks LOGIN; $webhook_grants");
my $webhook_db = $node->connstr('postgres') . ' user=billing_webhooks';

my $emulator = start_emulator();
my $proxy = ProxyHarness->start(conninfo => $node->connstr('postgres'), upstream => $emulator,
	args => [ '--webhook-database', $webhook_db ]);

# POST /webhooks/stripe as Stripe sends it: the JSON body and its signature, no Authorization.
sub post {
	my ($body, $signature) = @_;
	return $proxy->request('POST', '/webhooks/stripe', $body, content_type => 'application/json; charset=utf-8',
		headers => { defined $signature ? ('Stripe-Signature' => $signature) : () });
}
sub signed { my ($body) = @_; return post($body, webhook_signature($body, time, $secret)) }
sub answer { my ($r) = @_; return "$r->{status} " . ($r->{json}{result} // $r->{json}{error}{code} // $r->{content}) }

my $n = 0;
sub succeeded {
	my ($customer, %extra) = @_;
	return stripe_event(id => 'evt_182_' . ++$n, type => 'payment_intent.succeeded', %extra,
		object => { id => "pi_182$customer", object => 'payment_intent', amount => 1000 + $customer, currency => 'usd',
			customer => "cus_00000$customer", status => 'succeeded', metadata => { billguard_key => $node->key_of("cust_00000$customer", '2026-08') } });
}
sub everything {
	return $node->q1(q{SELECT string_agg(customer_id || ':' || status || ':' || coalesce(charge_id, ''), ' ' ORDER BY customer_id)
	                     || ' journal=' || (SELECT count(*) FROM billguard.journal)
	                     || ' events=' || (SELECT count(*) FROM billguard.stripe_events)
	                  FROM billguard.billing_records});
}

# ---- applied, and applied once --------------------------------------------------------

my $first = succeeded(1);
my $response = signed($first);
is(answer($response), '200 completed', 'a signed delivery: 200, applied (completed)');
is_deeply($response->{json}, { received => JSON::PP::true, result => 'completed' }, 'the body says so');
is($node->record_of('cust_000001', '2026-08'), 'completed|pi_1821|1', 'the unknown record is completed through the proxy');
is(answer(signed($first)), '200 already_seen', 'the same delivery again: 200 already_seen');

# Bytes a JSON-aware intermediary would rewrite: the signature covers them as sent.
my $unusual = succeeded(2, description => "Ab\x{00e9}onnement \x{2014} ao\x{00fb}t") =~ s/,/,\n   /gr;
utf8::encode($unusual);
is(answer(signed($unusual)), '200 completed', 'non-ASCII, newlines and spacing: the body reaches the database byte for byte');

# ---- refused ---------------------------------------------------------------------------

my $before = everything();
my $third = succeeded(3);
my $r = post($third, webhook_signature($third, time, 'whsec_someoneElsesSecret0000000'));
is(answer($r), '400 webhook_rejected', 'signed with another secret: 400 webhook_rejected');
like($r->{json}{error}{message}, qr/^no v1 signature of the Stripe-Signature header matches the payload/,
	'... saying why, as a Stripe-shaped error');
is($r->{json}{error}{type}, 'invalid_request_error', '... of type invalid_request_error');
is(answer(post($third, webhook_signature($third, time - 900, $secret))), '400 webhook_rejected',
	'signed a quarter of an hour ago: 400');
$r = post($third, undef);
is(answer($r), '400 webhook_rejected', 'no Stripe-Signature header: 400');
is($r->{json}{error}{message}, 'the Stripe-Signature header is missing', '... saying so');
is(answer(signed('{"id":')), '400 webhook_rejected', 'signed, but not JSON: 400');
my $stranger = stripe_event(id => 'evt_182_stranger', type => 'payment_intent.succeeded',
	object => { id => 'pi_182x', object => 'payment_intent', amount => 1003, currency => 'usd',
		metadata => { billguard_key => '0' x 32 } });
$r = signed($stranger);
is(answer($r), '404 resource_missing', 'a key no record holds: 404');
like($r->{json}{error}{message}, qr/^no billing record has the key 0{32} that event evt_182_stranger names/, '... saying which');
is(everything(), $before, 'none of them changed anything');

# ---- the database cannot verify: 500, Stripe retries ------------------------------------

write_secret_file($secret_file, $secret, 0644);
$r = signed($third);
is($r->{status}, 500, 'a webhook secret file others may read: 500, so Stripe delivers it again');
like($r->{json}{error}{message}, qr/^the webhook could not be applied \(SQLSTATE 55000\)/, '... naming the SQLSTATE');
like($proxy->log_text, qr/billguard-proxy: a Stripe webhook could not be applied: Stripe webhooks cannot be verified: billguard.webhook_secret_file has group or world access/,
	'the proxy\'s log says why');
unlike($proxy->log_text . $r->{content}, qr/\Q$secret\E|\Q$secret_file\E/, 'neither the secret nor its path is in the log or the answer');
write_secret_file($secret_file, $secret);
is(answer(signed($third)), '200 completed', 'the file fixed, Stripe\'s retry is applied');

# ---- the database down: 503, then the same process applies the retry ---------------------

my $pid = $proxy->pid;
my $retried = succeeded(3, id => 'evt_182_retried');
$node->stop('fast');
is(answer(signed($retried)), '503 database_unavailable', 'the billing database down: 503');
$node->start;
ok(wait_until('the proxy to reach the database again', 30, sub { signed($retried)->{status} == 200 }),
	'once it is back, the retry is answered 200');
is($proxy->pid, $pid, 'by the same proxy process');
is($node->q1(q{SELECT effect FROM billguard.stripe_events WHERE event_id = 'evt_182_retried'}), 'confirmed',
	'and applied once');
like($proxy->request('GET', '/metrics', undef)->{content}, qr/billguard_proxy_requests_total\{decision="webhook",status="200"\} \d+/,
	'deliveries are counted in the metrics');

# ---- a record another session holds locked: answered, not waited for ----------------------

# One database connection for webhooks, and a tired operator's session that
# holds cust_000002's row lock and does not end.
my $narrow = ProxyHarness->start(conninfo => $node->connstr('postgres'), upstream => $emulator,
	args => [ '--webhook-database', $webhook_db, '--database-pool', '1' ]);
my ($held_out, $held_err) = ('', '');
my $holder = IPC::Run::start([ 'psql', '-XAtq', '-d', $node->connstr('postgres') . ' application_name=t182_holder', '-c',
	q{SELECT 1 FROM billguard.billing_records WHERE customer_id = 'cust_000002' FOR UPDATE; SELECT pg_sleep(600)} ],
	'>', \$held_out, '2>', \$held_err);
ok(wait_until('the lock holder', 30, sub {
	$node->q1(q{SELECT count(*) FROM pg_stat_activity WHERE application_name = 't182_holder' AND wait_event = 'PgSleep'}) eq '1' }),
	'another session holds cust_000002\'s record locked');
sub signed_to {
	my ($p, $body) = @_;
	return $p->request('POST', '/webhooks/stripe', $body, content_type => 'application/json',
		headers => { 'Stripe-Signature' => webhook_signature($body, time, $secret) });
}
my $locked = succeeded(2, id => 'evt_182_locked');
$r = signed_to($narrow, $locked);
is($r->{status}, 500, 'a delivery for the locked record: 500 once the lock wait gives up, so Stripe delivers it again');
like($narrow->log_text, qr/billguard-proxy: a Stripe webhook could not be applied: billing record \w{32} is locked by another session: event evt_182_locked was not applied/,
	'the proxy\'s log says which record is locked');
is(answer(signed_to($narrow, succeeded(3, id => 'evt_182_unlocked'))), '200 confirmed',
	'the connection it used serves the next delivery, for another record');
$node->q1(q{SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 't182_holder'});
$holder->finish;
is(answer(signed_to($narrow, $locked)), '200 confirmed', 'the lock released, Stripe\'s retry is applied');
$narrow->stop;

# ---- grants and configuration ---------------------------------------------------------------

$node->q1('CREATE ROLE t182_usage_only LOGIN; GRANT USAGE ON SCHEMA billguard TO t182_usage_only; CREATE ROLE t182_nothing LOGIN');
for my $case ([ 't182_usage_only', qr/^billguard-proxy: role t182_usage_only may not call billguard\.ingest_stripe_event\(text, text\) in --webhook-database postgres: grant what docs\/privileges\.md lists$/m ],
              [ 't182_nothing', qr/^billguard-proxy: --webhook-database: permission denied for schema billguard: grant what docs\/privileges\.md lists$/m ]) {
	my ($role, $expected) = @$case;
	my $refused = eval { ProxyHarness->start(conninfo => $node->connstr('postgres'), upstream => $emulator,
		args => [ '--webhook-database', $node->connstr('postgres') . " user=$role" ]) };
	ok(!$refused, "a webhook role without the grants ($role): the proxy refuses to start");
	like($@, $expected, '... with one line saying what to grant');
}
my $without = ProxyHarness->start(conninfo => $node->connstr('postgres'), upstream => $emulator);
is($without->request('POST', '/webhooks/stripe', $third, headers => { 'Stripe-Signature' => webhook_signature($third, time, $secret) })->{status},
	404, 'without --webhook-database, /webhooks/stripe is not served');

$node->stop;
done_testing();
