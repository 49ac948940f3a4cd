# ingest_stripe_event, the Stripe webhooks' way into a record, in SQL. Every signature
# is computed here by an independent implementation, OpenSSL's command line
# (openssl dgst -sha256 -hmac), over "<t>.<payload>":
#   - each event type against each record status: an unknown record is
#     completed, a needs_review one failed, a completed one confirmed,
#     refunded (partly, then fully) but never turned into anything else;
#     every applied event is in stripe_events, journaled as WebhookApplied
#     and folded into entity_state (a refund delivered late never shrinks
#     the amount refunded);
#   - a decline delivered late, of a PaymentIntent created a day or more
#     before the record's last attempt, leaves an unknown record unknown;
#   - a look-alike (another Stripe customer, a connected account) with the
#     key and amount of a record billguard has not charged: mismatch;
#   - a delivery that comes again, re-signed or not, or from 20 sessions at
#     once: applied once;
#   - a rolled secret: two v1 signatures pass, on a server holding either
#     secret; one made only with another secret does not;
#   - a stale or future timestamp, a tampered payload, malformed JSON or
#     headers, an unknown key: the exact error and SQLSTATE, nothing changed;
#   - events about something billguard did not charge are ignored;
#   - the secret appears in no log line, error or pg_settings row a
#     non-superuser can read; a secret file others may read is refused (55000);
#   - stripe_events is dumped with its rows and archive_history moves it.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use SecretFile qw(write_secret_file);
use JSON::PP;
use BillguardTest;
use BillguardNode;
use StripeWebhook;

my $secret = 'whsec_181ingestSecretAbcdefghij0123';
my $old_secret = 'whsec_181previousSecret9876543210';
my $secret_file;
my $node = BillguardNode->preloaded('webhooks', sub {
	my ($n) = @_;
	$secret_file = $n->basedir . '/webhook.secret';
	write_secret($secret);
	return ("billguard.webhook_secret_file = '$secret_file'", 'log_min_messages = debug1',
		'log_statement = all');
});

sub write_secret { my ($content, $mode) = @_; write_secret_file($secret_file, $content, $mode) }

# (exit code, result, stderr) of ingest_stripe_event($payload, $header).
sub ingest {
	my ($payload, $header) = @_;
	my ($rc, $out, $err) = $node->psql('postgres', q{SELECT billguard.ingest_stripe_event(:'payload', :'header')},
		extra_params => [ '-v', "payload=$payload", '-v', "header=$header" ]);
	return ($rc, $out, $err);
}

# A signed delivery: ingest_stripe_event's answer, or the error.
sub deliver {
	my ($payload, @keys) = @_;
	my $t = time;
	my ($rc, $out, $err) = ingest($payload, webhook_signature($payload, $t, @keys ? @keys : ($secret)));
	return $rc == 0 ? $out : $err;
}

my $event_number = 0;
# A Stripe event of $type about an object of customer $customer's 2026-08
# record (its key in metadata), with %object fields overriding the defaults.
sub event {
	my ($type, $customer, %object) = @_;
	my $kind = $type =~ /^charge\./ ? 'charge' : 'payment_intent';
	my %defaults = (id => ($kind eq 'charge' ? 'ch_' : 'pi_') . "181$customer", object => $kind,
		amount => 1000 + substr($customer, -1), currency => 'usd', customer => "cus_00000$customer",
		metadata => { billguard_key => $node->key_of("cust_00000$customer", '2026-08') });
	$defaults{payment_intent} = "pi_181$customer" if $kind eq 'charge';
	return stripe_event(id => 'evt_181_' . ++$event_number, type => $type, object => { %defaults, %object });
}

sub record { my ($customer) = @_; return $node->record_of("cust_00000$customer", '2026-08') }

# Everything an event could change.
sub state_of_everything {
	return $node->q1(q{
		SELECT (SELECT string_agg(customer_id || ':' || status || ':' || coalesce(charge_id, '') || ':'
		                          || coalesce(last_error, ''), ' ' ORDER BY customer_id)
		          FROM billguard.billing_records)
		       || ' journal=' || (SELECT count(*) FROM billguard.journal)
		       || ' events=' || (SELECT count(*) FROM billguard.stripe_events)});
}

# ---- records in every status --------------------------------------------------------

# cust_000001..9 billed for 2026-08; amounts 1001..1009 (add_accounts gives 1000 + n % 500).
$node->add_accounts(9);
is($node->q1("SELECT initiated FROM billguard.bill_period('2026-08')"), '9', 'nine records claimed');
$node->q1(q{
	UPDATE billguard.billing_records
	   SET status = CASE right(customer_id, 1)
	                  WHEN '1' THEN 'unknown' WHEN '2' THEN 'unknown' WHEN '3' THEN 'needs_review'
	                  WHEN '4' THEN 'dispatching' WHEN '5' THEN 'completed' WHEN '6' THEN 'failed'
	                  WHEN '7' THEN 'cancelled' ELSE 'pending' END,
	       charge_id = CASE WHEN customer_id = 'cust_000005' THEN 'pi_1815' END,
	       first_dispatched_at = CASE WHEN customer_id <> 'cust_000007' THEN now() END,
	       attempts = CASE WHEN customer_id <> 'cust_000007' THEN 1 ELSE 0 END});

# ---- each event against each status ---------------------------------------------------

is(deliver(event('payment_intent.succeeded', 1)), 'completed', 'unknown + payment_intent.succeeded: completed');
is(record(1), 'completed|pi_1811|1', 'the unknown record is completed with the PaymentIntent');
my $applied = $node->events_of('cust_000001', '2026-08', 'WebhookApplied');
is_deeply($applied, [ { event_id => 'evt_181_1', event_type => 'payment_intent.succeeded', object_id => 'pi_1811',
	effect => 'completed', previous_status => 'unknown', charge_id => 'pi_1811' } ],
	'journaled: WebhookApplied with the event, the effect, the previous status and the charge');
is($node->q1(q{SELECT billguard.entity_state('billing-cust_000001-2026-08') ->> 'status'
               || ' ' || (billguard.entity_state('billing-cust_000001-2026-08') ->> 'charge_id')}),
	'completed pi_1811', 'entity_state folds it: completed with the charge');
is($node->q1(q{SELECT event_type || ' ' || object_id || ' ' || effect || ' ' || customer_id || ' ' || billing_period
               FROM billguard.stripe_events WHERE event_id = 'evt_181_1'}),
	'payment_intent.succeeded pi_1811 completed cust_000001 2026-08', 'kept in stripe_events');

is(deliver(event('charge.succeeded', 2, id => 'ch_1812')), 'completed',
	'unknown + charge.succeeded (of a PaymentIntent): completed');
is(record(2), 'completed|pi_1812|1', 'with the PaymentIntent the Charge names, as the dispatcher would record it');

my $declined = event('payment_intent.payment_failed', 3, last_payment_error => { type => 'card_error',
	code => 'card_declined', decline_code => 'generic_decline', message => 'Your card was declined.' });
is(deliver($declined), 'failed', 'needs_review + payment_intent.payment_failed: failed');
is(record(3), 'failed||1', 'the record failed, no charge');
is($node->q1("SELECT last_error FROM billguard.billing_records WHERE customer_id = 'cust_000003'"),
	'webhook payment_intent.payment_failed card_declined/generic_decline: Your card was declined.',
	'last_error says which event and why');

# A decline delivered late, of a PaymentIntent older than the record's last
# attempt: cust_000003's 2026-09 request was declined two days ago
# (pi_181old), the record was requeued, and its new attempt, sent with the
# same key when Stripe may have forgotten it, got a cached 500.
is($node->q1("SELECT status FROM billguard.bill_customer('cust_000003', '2026-09')"), 'initiated', 'cust_000003 billed for 2026-09');
$node->q1(q{UPDATE billguard.billing_records SET status = 'unknown', attempts = 1, first_dispatched_at = now() - interval '2 days'
             WHERE customer_id = 'cust_000003' AND billing_period = '2026-09';
            SELECT billguard.append_billing_event('cust_000003', '2026-09', 'ChargeAttempted',
              jsonb_build_object('attempt', 1, 'action', 'search', 'at', now()))});
sub declined_in_september {
	my ($id, $created) = @_;
	return stripe_event(id => "evt_181_$id", type => 'payment_intent.payment_failed', object => { id => $id,
		object => 'payment_intent', amount => 1003, currency => 'usd', customer => 'cus_000003', created => $created,
		metadata => { billguard_key => $node->key_of('cust_000003', '2026-09') },
		last_payment_error => { code => 'card_declined', message => 'Your card was declined.' } });
}
is(deliver(declined_in_september('pi_181old', time - 2 * 86400)), 'unchanged',
	'unknown + a decline of a PaymentIntent created two days before the record\'s last attempt: unchanged');
is($node->record_of('cust_000003', '2026-09'), 'unknown||1', 'the record is still unknown: its own request may have charged');
is(deliver(declined_in_september('pi_181new', time)), 'failed', 'a decline of one created since: failed');

is(deliver(event('charge.failed', 4, failure_code => 'card_declined', failure_message => 'Your card was declined.')),
	'unchanged', 'dispatching + charge.failed: unchanged, the dispatcher hears it from Stripe itself');
is(record(4), 'dispatching||1', 'the record is still the dispatcher\'s');

is(deliver(event('payment_intent.succeeded', 5)), 'confirmed', 'completed + its own success: confirmed');
my $before = state_of_everything();
is(deliver(event('payment_intent.payment_failed', 5)), 'kept',
	'completed + a failure of its own PaymentIntent: kept, never turned into anything else');
is(record(5), 'completed|pi_1815|1', 'the record is still completed with its charge');
like(slurp_file($node->logfile), qr/WARNING:  billguard webhook: evt_181_\d+ \(payment_intent.payment_failed\) for cust_000005\/2026-08 changed nothing: a payment_intent.payment_failed for a completed record/,
	'and a warning asks a person to look');
is(deliver(event('payment_intent.succeeded', 5, id => 'pi_181second')), 'other_charge',
	'completed + a success of another PaymentIntent with its key: other_charge');
is(record(5), 'completed|pi_1815|1', 'the record keeps its one charge');
like(slurp_file($node->logfile), qr/changed nothing: charge pi_181second, while the record completed with pi_1815/,
	'the second charge is logged for a person');

is(deliver(event('charge.refunded', 5, id => 'ch_1815', amount_refunded => 400, refunded => JSON::PP::false)),
	'refunded', 'completed + charge.refunded (partly): refunded');
is(record(5), 'completed|pi_1815|1', 'the record stays completed: the period was billed and is never billed again');
is(deliver(event('charge.refunded', 5, id => 'ch_1815', amount_refunded => 1005, refunded => JSON::PP::true)),
	'refunded', 'then fully refunded');
is($node->q1(q{SELECT string_agg(effect || ' ' || amount_refunded_cents, ', ' ORDER BY received_at, event_id)
               FROM billguard.stripe_events WHERE customer_id = 'cust_000005' AND event_type = 'charge.refunded'}),
	'refunded 400, refunded 1005', 'stripe_events holds both refunds with the amount refunded so far');
is(join(' ', map { "$_->{amount_refunded_cents}:" . ($_->{fully_refunded} ? 'full' : 'part') }
		@{ $node->events_of('cust_000005', '2026-08', 'WebhookApplied') }[ -2, -1 ]),
	'400:part 1005:full', 'the journal says how much was refunded, and when fully');
is($node->q1(q{SELECT (billguard.entity_state('billing-cust_000005-2026-08') ->> 'status') || ' '
               || (billguard.entity_state('billing-cust_000005-2026-08') ->> 'refunded_cents')}),
	'completed 1005', 'entity_state: completed, 1005 cents refunded');
is(deliver(event('charge.refunded', 5, id => 'ch_1815', amount_refunded => 700, refunded => JSON::PP::false)),
	'refunded', 'a partial refund\'s event delivered after the full one (Stripe keeps no order): refunded');
is($node->q1(q{SELECT billguard.entity_state('billing-cust_000005-2026-08') ->> 'refunded_cents'}), '1005',
	'entity_state still says 1005 cents: an event delivered late never shrinks what was refunded');
is($node->q1("SELECT status FROM billguard.bill_customer('cust_000005', '2026-08')"), 'already_completed',
	'bill_customer still answers already_completed: a refund never reopens the period');

is(deliver(event('charge.failed', 6)), 'confirmed', 'failed + a failure: confirmed');
is(deliver(event('charge.failed', 7)), 'kept', 'cancelled + a failure: kept');
is(record(7), 'cancelled||0', 'the cancelled record stays cancelled');
is(deliver(event('payment_intent.succeeded', 8, amount => 999)), 'mismatch', 'another amount: mismatch');
is(deliver(event('payment_intent.succeeded', 8, currency => 'eur')), 'mismatch', 'another currency: mismatch');
is(record(8), 'pending||1', 'the record is unchanged by either');

# Look-alikes: the record's key, amount and currency, but not its Stripe
# customer, or from a connected account (a Connect endpoint hears every
# connected account's events, whose metadata their owners write).
is(deliver(event('payment_intent.succeeded', 8, customer => 'cus_181other')), 'mismatch',
	'another Stripe customer\'s PaymentIntent with the record\'s key and amount: mismatch');
like(slurp_file($node->logfile), qr/changed nothing: the event is about 1008 usd of customer cus_181other, the record about 1008 usd of cus_000008/,
	'... logged for a person, naming both customers');
is(deliver(event('charge.succeeded', 8, customer => undef)), 'mismatch', 'a Charge of no customer: mismatch');
my $connected = event('payment_intent.succeeded', 8) =~ s/^\{/{"account":"acct_181connected",/r;
is(deliver($connected), 'mismatch',
	'an event of a connected account (Connect) about a platform record, its own customer and key: mismatch');
like(slurp_file($node->logfile), qr/changed nothing: the event comes from connected account acct_181connected, the record's charge is made on the platform's own account/,
	'... saying so');
is(record(8), 'pending||1', 'the record billguard has not charged is still pending: its customer is billed');

# ---- at least once: applied once ------------------------------------------------------

my $refund = event('charge.refunded', 9, id => 'ch_1819', amount_refunded => 1009);
is(deliver($refund), 'refunded', 'pending + charge.refunded: the charge happened, and was refunded');
is(record(9), 'completed|pi_1819|1', 'the record is completed with the refunded charge');
$before = state_of_everything();
is(deliver($refund), 'already_seen', 'the same delivery again: already_seen');
my $t = time;
is((ingest($refund, webhook_signature($refund, $t + 1, $secret)))[1], 'already_seen', 're-signed later, as Stripe retries: already_seen');
is(state_of_everything(), $before, 'and nothing changed');

# 20 sessions deliver one event at the same instant.
my $raced = event('payment_intent.succeeded', 4);
my $raced_header = webhook_signature($raced, time, $secret);
my $gate = $node->start_gate;
my @racers = map {
	$node->race_psql("SELECT billguard.ingest_stripe_event(\$evt\$$raced\$evt\$, '$raced_header')")
} 1 .. 20;
$node->release_gate($gate, 20);
finish_race(@racers);
my %answers;
$answers{ $_->{out} =~ s/\n//r }++ for @racers;
is_deeply(\%answers, { completed => 1, already_seen => 19 }, '20 concurrent deliveries: applied once, 19 already seen');
is($node->q1(q{SELECT count(*) FROM billguard.journal
               WHERE persistence_id = 'billing-cust_000004-2026-08' AND event_type = 'WebhookApplied'
                 AND event ->> 'effect' = 'completed'}), '1', 'one WebhookApplied for it');
is(record(4), 'completed|pi_1814|1', 'the dispatching record is completed by it');

# ---- a rolled secret --------------------------------------------------------------------

my $rolled = event('charge.succeeded', 1, id => 'ch_1811');
is(deliver($rolled, $old_secret, $secret), 'confirmed', 'two v1 signatures (old and new secret): accepted');
write_secret($old_secret);
my $rolled_again = event('charge.succeeded', 2, id => 'ch_1812');
is(deliver($rolled_again, $old_secret, $secret), 'confirmed',
	'a server still holding the old secret accepts the same kind of delivery (the file is read at every call)');
write_secret($secret);
$before = state_of_everything();
my $by_old = event('charge.succeeded', 6);
like(deliver($by_old, $old_secret), qr/ERROR:  no v1 signature of the Stripe-Signature header matches the payload: it was signed with another secret, or the payload was changed/,
	'signed only with the old secret, once the server holds the new one: refused');

# ---- refused deliveries -----------------------------------------------------------------

sub refused {
	my ($payload, $header, $message, $name) = @_;
	my ($rc, $out, $err) = ingest($payload, $header);
	like($err, qr/ERROR:  \Q$message\E/, $name);
	return $err;
}
my $fresh = event('payment_intent.succeeded', 6);
my $stale_t = time - 600;
refused($fresh, webhook_signature($fresh, $stale_t, $secret), 'the Stripe-Signature timestamp is', 'a timestamp ten minutes old: refused');
like((ingest($fresh, webhook_signature($fresh, $stale_t, $secret)))[2],
	qr/ERROR:  the Stripe-Signature timestamp is \d+ s old, beyond the 300 s tolerance: a replayed or late delivery/,
	'... saying it is a replayed or late delivery');
like((ingest($fresh, webhook_signature($fresh, time + 600, $secret)))[2],
	qr/ERROR:  the Stripe-Signature timestamp is \d+ s in the future, beyond the 300 s tolerance/,
	'a timestamp ten minutes ahead: refused');
my $signed_t = time;
my $header = webhook_signature($fresh, $signed_t, $secret);
(my $tampered = $fresh) =~ s/"amount":1006/"amount":1/;
isnt($tampered, $fresh, 'the tampered payload differs');
refused($tampered, $header, 'no v1 signature of the Stripe-Signature header matches the payload', 'a tampered payload: refused');
refused("$fresh ", $header, 'no v1 signature', 'one byte added: refused');
refused($fresh, "t=$signed_t", 'the Stripe-Signature header is malformed: it has no v1 signature', 'no v1: refused');
refused($fresh, 'v1=' . webhook_hmac($secret, $signed_t, $fresh), 'the Stripe-Signature header is malformed: it has no timestamp (t=)',
	'no timestamp: refused');
refused($fresh, '', 'the Stripe-Signature header is malformed: it is empty', 'an empty header: refused');
my ($rc, $out, $err) = $node->psql('postgres', q{SELECT billguard.ingest_stripe_event('{}', NULL)});
like($err, qr/ERROR:  the Stripe-Signature header is missing/, 'no header at all: refused');
my $not_json = '{"id": "evt_181_x", "type": ';
refused($not_json, webhook_signature($not_json, time, $secret), 'the webhook payload is not JSON: invalid input syntax for type json',
	'signed, but not JSON: refused');
my $not_event = '["evt_181_x"]';
refused($not_event, webhook_signature($not_event, time, $secret),
	'the webhook payload is not a Stripe event billguard can apply: it is not a JSON object', 'JSON but not an event: refused');
my $no_amount = event('payment_intent.succeeded', 6, amount => '1006');
refused($no_amount, webhook_signature($no_amount, time, $secret),
	'the webhook payload is not a Stripe event billguard can apply: data.object.amount is not an amount in cents',
	'an amount that is a string: refused');
my $unknown_key = event('payment_intent.succeeded', 6, metadata => { billguard_key => 'f' x 32 });
refused($unknown_key, webhook_signature($unknown_key, time, $secret),
	'no billing record has the key ' . ('f' x 32) . ' that event evt_181_', 'an unknown key: refused');
my ($rc2, $out2, $notice) = $node->psql('postgres', qq{
	DO \$\$BEGIN PERFORM billguard.ingest_stripe_event(\$evt\$$unknown_key\$evt\$, '} . webhook_signature($unknown_key, time, $secret) . q{');
	EXCEPTION WHEN no_data_found THEN RAISE NOTICE 'sqlstate P0002'; END$$});
like($notice, qr/NOTICE:  sqlstate P0002/, 'an unknown key is P0002');
($rc2, $out2, $notice) = $node->psql('postgres', q{
	DO $$BEGIN PERFORM billguard.ingest_stripe_event('{}', 't=1,v1=00');
	EXCEPTION WHEN invalid_parameter_value THEN RAISE NOTICE 'sqlstate 22023'; END$$});
like($notice, qr/NOTICE:  sqlstate 22023/, 'a bad signature is 22023');
is(state_of_everything(), $before, 'none of the refused deliveries changed anything');

# ---- not billguard's ----------------------------------------------------------------------

my $customer_event = stripe_event(id => 'evt_181_customer', type => 'customer.created',
	object => { id => 'cus_181', object => 'customer' });
is(deliver($customer_event), 'ignored', 'customer.created: ignored');
my $foreign = event('payment_intent.succeeded', 6, metadata => { order => '42' });
is(deliver($foreign), 'ignored', 'a PaymentIntent without metadata.billguard_key (not ours): ignored');
is(state_of_everything(), $before, 'and nothing is kept of them');

# ---- the secret stays secret ---------------------------------------------------------------

my $log = slurp_file($node->logfile);
unlike($log, qr/\Q$secret\E|\Q$old_secret\E/, 'neither secret is in the server log (log_statement = all, debug1)');
$node->q1('CREATE ROLE t181_reader LOGIN');
($rc, $out, $err) = $node->psql('postgres', 'SHOW billguard.webhook_secret_file', extra_params => [ '-U', 't181_reader' ]);
# 16 reworded it: "permission denied to examine" (15: "must be superuser or
# have privileges of pg_read_all_settings to examine").
like($err, qr/ERROR:  (?:must be superuser.*|permission denied) to examine "billguard.webhook_secret_file"/,
	'a non-superuser cannot SHOW the secret file\'s path');
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_settings WHERE name = 'billguard.webhook_secret_file'},
	extra_params => [ '-U', 't181_reader' ]), '0', 'nor find it in pg_settings');
write_secret($secret, 0644);
my $open = event('payment_intent.succeeded', 6);
($rc, $out, $err) = ingest($open, webhook_signature($open, time, $secret));
like($err, qr/ERROR:  Stripe webhooks cannot be verified: billguard.webhook_secret_file has group or world access \(mode 0644\): it must be readable by its owner only, chmod 600 it/,
	'a secret file others may read: refused, saying why');
unlike($err, qr/\Q$secret_file\E|\Q$secret\E/, 'without the file\'s path or the secret');
($rc2, $out2, $notice) = $node->psql('postgres', q{
	DO $$BEGIN PERFORM billguard.ingest_stripe_event('{}', 't=1,v1=00');
	EXCEPTION WHEN object_not_in_prerequisite_state THEN RAISE NOTICE 'sqlstate 55000'; END$$});
like($notice, qr/NOTICE:  sqlstate 55000/, '(55000: the server, not the delivery, must be fixed; Stripe retries)');
write_secret('sk_test_not_a_webhook_secret');
($rc, $out, $err) = ingest($open, webhook_signature($open, time, $secret));
like($err, qr/ERROR:  Stripe webhooks cannot be verified: billguard.webhook_secret_file does not hold a webhook signing secret \(whsec_...\)/,
	'a file holding something else: refused');
write_secret($secret);
is($node->q1(q{SELECT count(*) FROM billguard.stripe_events e WHERE row_to_json(e)::text ~ 'whsec_'}), '0',
	'no secret in stripe_events');

# ---- kept with the history -------------------------------------------------------------------

is($node->q1(q{SELECT 'billguard.stripe_events'::regclass = ANY (extconfig) FROM pg_extension WHERE extname = 'billguard'}),
	't', 'stripe_events is dumped with its rows (pg_extension_config_dump)');
my $events = $node->q1('SELECT count(*) FROM billguard.stripe_events');
$node->q1(q{UPDATE billguard.billing_records SET status = 'failed' WHERE status IN ('pending', 'dispatching', 'unknown')});
like($node->q1(q{SELECT string_agg(archived_table || '=' || row_count, ' ') FROM billguard.archive_history('t181_archive')}),
	qr/t181_archive\.stripe_events=$events/, "archive_history moves stripe_events with its $events rows");
($rc, $out, $err) = $node->psql('postgres', 'DELETE FROM t181_archive.stripe_events');
like($err, qr/t181_archive\.stripe_events is archived billing history: DELETE refused/, 'read-only there');

$node->stop;
done_testing();
