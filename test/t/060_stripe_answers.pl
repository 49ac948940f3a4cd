# Every kind of answer Stripe gives, end to end: the real dispatcher against
# the emulator, asserted at the emulator (ledger, stats) and in the database
# (record, journal events, bill_customer's answer).
#
#   group 1 (one node, one emulator, search_settle_delay 1 s):
#     500 cached with the charge created -> unknown -> search finds it ->
#         completed with the emulator's id (ChargeReconciled), one charge;
#     402 card_declined -> failed, terminal BillingFailed, never re-sent;
#     400 idempotency_error (the key was used first with other parameters)
#         -> needs_review, never re-sent; retry_record re-sends once with the
#         same key (needs_review again); resolve_record completes it;
#     500 cached with nothing created -> unknown -> search finds nothing ->
#         re-sent with the same key -> the cached 500 replayed -> unknown
#         again; never a second key, never completed, no charge (with
#         max_unknown_cycles raised out of the way: 127 shows where the
#         cycle ends);
#     settings: api_base must be https or loopback http, stripe_endpoint
#         one of the two charge endpoints.
#     500 cached with the charge created while search lags 2.5 s: the first
#         search misses, the re-sent charge gets the cached 500, a later
#         search finds it: one charge;
#   group 2: a 429 storm (emulator 20/s, billguard allowed 500/s, 200
#         accounts): all completed, none failed, one charge each.
#   group 3: 401 (wrong key file) -> paused with a reason, nothing failed
#         (a key file without a key: paused, its content never echoed);
#         the right key and a reload -> everything completes; the key never
#         shows in the server log nor to a non-superuser in pg_settings.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep time);
use JSON::PP;
use BillguardTest;
use BillguardNode;

# ---- local helpers (shared ones: test/lib) ---------------------------------

# Inserts one active account $customer (stripe customer cus_<customer>).
sub add_account {
	my ($node, $customer, $amount, $pm) = @_;
	(my $cus = $customer) =~ s/[^A-Za-z0-9]//g;
	$node->q1(qq{
		INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method)
		VALUES ('$customer', 'cus_$cus', $amount, 'usd', '$pm')});
}

my $t0 = time;

# ============================================================================
# group 1: 500, 402, 400 idempotency_error, 500 without creation, settings
# ============================================================================
{
	my $emulator = start_emulator(latency_ms => 5);
	my $node = BillguardNode->dispatching('answers', $emulator,
		"billguard.search_settle_delay = '1s'",
		"billguard.max_unknown_cycles = 1000",
		"billguard.max_requests_per_second = 50");
	add_account($node, 't060_500', 1500, 'pm_card_visa');
	add_account($node, 't060_402', 1402, 'pm_card_chargeDeclined');
	add_account($node, 't060_400', 1400, 'pm_card_visa');
	add_account($node, 't060_500nc', 1501, 'pm_card_visa');
	add_account($node, 't060_500lag', 1502, 'pm_card_visa');

	# ---- 500, cached, charge created: unknown, then reconciled by search ----
	{
		my ($c, $p) = ('t060_500', '2030-01');
		my $key = $node->key_of($c, $p);
		is($emulator->add_fault(kind => 'status', status => 500, count => 1)->{json}{queued}, 1,
			'500: one 500 fault queued');
		is($node->bill($c, $p), 'initiated', '500: billing initiated');
		ok(wait_until("$c unknown", 10, sub { $node->q1("SELECT status FROM billguard.billing_records WHERE customer_id = '$c'") eq 'unknown' }),
			'500: the record goes unknown');
		like($node->q1("SELECT last_error FROM billguard.billing_records WHERE customer_id = '$c'"),
			qr/^500 api_error/, '500: last_error names the 500 api_error');
		ok($node->wait_until_settled($p, 30), '500: the record settles');
		my $ledger = ledger_for_key($emulator, $key);
		is(scalar(@$ledger), 1, '500: the emulator holds exactly one object for the key');
		is($ledger->[0]{status}, 'succeeded', '500: it succeeded (the 500 rolled forward)');
		is($node->record_of($c, $p), "completed|$ledger->[0]{id}|2",
			"500: completed with the emulator's id after 2 attempts (charge, search)");
		is($node->event_types($c, $p),
			'BillingInitiated,ChargeAttempted,ChargeUnknown,ChargeAttempted,ChargeReconciled',
			'500: events initiated, attempted, unknown, attempted, reconciled');
		my $attempts = $node->events_of($c, $p, 'ChargeAttempted');
		is(join(',', map { $_->{action} } @$attempts), 'charge,search', '500: first a charge, then a search');
		is(join(',', map { $_->{idempotency_key} } @$attempts), "$key,$key", '500: both attempts carry the stored key');
		my $unknown = $node->events_of($c, $p, 'ChargeUnknown')->[0];
		is($unknown->{http_status}, 500, 'ChargeUnknown: http_status 500');
		is($unknown->{type}, 'api_error', 'ChargeUnknown: type api_error');
		my $reconciled = $node->events_of($c, $p, 'ChargeReconciled')->[0];
		is($reconciled->{charge_id}, $ledger->[0]{id}, "ChargeReconciled: the emulator's id");
		is($reconciled->{via}, 'search', 'ChargeReconciled: via search');
		like($unknown->{request_id} // '', qr/^req_\w+$/, "ChargeUnknown: the 500's Request-Id");
		like($reconciled->{request_id} // '', qr/^req_\w+$/, "ChargeReconciled: the search's Request-Id");
		isnt($reconciled->{request_id} // '', $unknown->{request_id} // '', '(two answers, two Request-Ids)');
		my $gap = $node->q1(qq{
			SELECT extract(epoch FROM max(written_at) FILTER (WHERE event_type = 'ChargeReconciled')
			                        - max(written_at) FILTER (WHERE event_type = 'ChargeUnknown'))
			  FROM billguard.journal WHERE persistence_id = 'billing-$c-$p'});
		cmp_ok($gap, '>=', 0.95, "500: search waited for search_settle_delay (1 s; took ${gap} s)");
		is(scalar(@{ charges_by_key($emulator)->{$key} // [] }), 1, '500: exactly one successful charge for the key');
		is($node->q1("SELECT status || '|' || coalesce(charge_id, '') FROM billguard.bill_customer('$c', '$p')"),
			"already_completed|$ledger->[0]{id}", '500: bill_customer answers already_completed with the id');
		is($emulator->stats->{faults_applied}, 1, '500: the fault was applied');
	}

	# ---- 500, cached, charge created, but search lags 2.5 s behind ----
	# The first search finds nothing, so the charge is re-sent with the same
	# key and the cached 500 is replayed (unknown again); a later search finds
	# the charge. Never a second charge.
	{
		my ($c, $p) = ('t060_500lag', '2030-08');
		my $key = $node->key_of($c, $p);
		$emulator->configure(search_delay_ms => 2500);
		my $replayed_before = $emulator->stats->{replayed};
		is($emulator->add_fault(kind => 'status', status => 500, count => 1)->{json}{queued}, 1, '500, search lag: fault queued');
		is($node->bill($c, $p), 'initiated', '500, search lag: billing initiated');
		ok($node->wait_until_settled($p, 30), '500, search lag: the record settles');
		my $ledger = ledger_for_key($emulator, $key);
		is(scalar(@$ledger), 1, '500, search lag: exactly one object for the key');
		is($node->record_of($c, $p) =~ s/\|\d+$//r, "completed|$ledger->[0]{id}", "500, search lag: completed with the emulator's id");
		is(scalar(@{ charges_by_key($emulator)->{$key} // [] }), 1, '500, search lag: exactly one successful charge');
		cmp_ok(scalar(@{ $node->events_of($c, $p, 'ChargeUnknown') }), '>=', 2,
			'500, search lag: unknown again after the re-sent charge got the cached 500');
		cmp_ok($emulator->stats->{replayed} - $replayed_before, '>=', 1, '500, search lag: the re-sent charge was a replay');
		is(scalar(@{ $node->events_of($c, $p, 'ChargeReconciled') }), 1, '500, search lag: reconciled once, by search');
		is(scalar(grep { $_->{idempotency_key} ne $key } @{ $node->events_of($c, $p, 'ChargeAttempted') }), 0,
			'500, search lag: every attempt used the stored key');
		$emulator->configure(search_delay_ms => 0);
	}

	# ---- 402 card_declined: failed, terminal, never re-sent ----
	{
		my ($c, $p) = ('t060_402', '2030-03');
		my $key = $node->key_of($c, $p);
		is($node->bill($c, $p), 'initiated', '402: billing initiated');
		ok($node->wait_until_settled($p, 30), '402: the record settles');
		my ($status, $charge, $attempts) = split /\|/, $node->record_of($c, $p), -1;
		is($status, 'failed', '402: the record is failed');
		is($charge, '', '402: no charge id');
		is($attempts, 1, '402: after one attempt');
		like($node->q1("SELECT last_error FROM billguard.billing_records WHERE customer_id = '$c'"),
			qr/^402 card_error\/card_declined: Your card was declined/, '402: last_error mentions card_declined');
		my $failed = $node->events_of($c, $p, 'BillingFailed');
		is(scalar(@$failed), 1, '402: one BillingFailed event');
		is($failed->[0]{terminal}, JSON::PP::true, 'BillingFailed: terminal = true');
		is($failed->[0]{code}, 'card_declined', 'BillingFailed: code card_declined');
		is($failed->[0]{decline_code}, 'generic_decline', 'BillingFailed: decline_code generic_decline');
		is($failed->[0]{http_status}, 402, 'BillingFailed: http_status 402');
		like($failed->[0]{request_id} // '', qr/^req_\w+$/, "BillingFailed: Stripe's Request-Id");
		is($node->q1("SELECT status || '|' || idempotency_key FROM billguard.bill_customer('$c', '$p')"),
			"failed|$key", '402: bill_customer answers failed with the key');
		my $ledger = ledger_for_key($emulator, $key);
		is(scalar(@$ledger), 1, '402: one object at the emulator');
		is($ledger->[0]{status}, 'requires_payment_method', '402: a declined PaymentIntent, not charged');
		my $requests = $emulator->stats->{requests};
		sleep 2;    # ten poll intervals
		is($emulator->stats->{requests}, $requests, '402: no request is sent later');
		is($node->record_of($c, $p), 'failed||1', '402: the record is unchanged');
	}

	# ---- 400 idempotency_error: the key was used first with other parameters ----
	{
		my ($c, $p) = ('t060_400', '2030-04');
		my $key = $node->key_of($c, $p);
		# Someone else (a stale deployment, a hand-made request) used our key
		# first, with the dispatcher's bearer key and a different amount.
		my $first = $emulator->post_form('/v1/payment_intents',
			StripeEmulatorHarness::payment_intent_params(amount => 999, customer => 'cus_t060400'),
			idempotency_key => $key, api_key => $StripeEmulatorHarness::DEFAULT_API_KEY);
		is($first->{status}, 200, '400: the foreign request with our key succeeded');
		my $foreign_id = $first->{json}{id};
		like($foreign_id, qr/^pi_/, '400: it created a PaymentIntent');

		is($node->bill($c, $p), 'initiated', '400: billing initiated');
		ok($node->wait_until_settled($p, 30), '400: the record settles');
		is($node->record_of($c, $p), 'needs_review||1', '400: needs_review, no charge id, one attempt');
		like($node->q1("SELECT last_error FROM billguard.billing_records WHERE customer_id = '$c'"),
			qr/^400 idempotency_error/, '400: last_error names the idempotency_error');
		my $review = $node->events_of($c, $p, 'NeedsReview');
		is(scalar(@$review), 1, '400: one NeedsReview event');
		is($review->[0]{type}, 'idempotency_error', 'NeedsReview: type idempotency_error');
		is($review->[0]{http_status}, 400, 'NeedsReview: http_status 400');
		like($review->[0]{request_id} // '', qr/^req_\w+$/, "NeedsReview: Stripe's Request-Id");
		is($emulator->stats->{idempotency_conflicts}, 1, '400: the emulator saw one idempotency conflict');
		is($node->bill($c, $p), 'in_progress',
			'400: bill_customer answers in_progress for a record under review');
		my $requests = $emulator->stats->{requests};
		sleep 1.5;
		is($emulator->stats->{requests}, $requests, '400: never re-sent by itself');

		# retry_record is allowed for needs_review: it re-sends once with the
		# same key, which conflicts again.
		is($node->q1("SELECT billguard.retry_record('$c', '$p')"), 'pending', 'retry_record on needs_review answers pending');
		ok(wait_until("a second conflict and $c needs_review", 10, sub { $emulator->stats->{idempotency_conflicts} >= 2
				&& $node->q1("SELECT status FROM billguard.billing_records WHERE customer_id = '$c'") eq 'needs_review' }),
			'retry_record: the same key is re-sent and conflicts again -> needs_review');
		is($node->event_types($c, $p),
			'BillingInitiated,ChargeAttempted,NeedsReview,RecordRequeued,ChargeAttempted,NeedsReview',
			'400: events initiated, attempted, review, requeued, attempted, review');
		my $requeued = $node->events_of($c, $p, 'RecordRequeued')->[0];
		is($requeued->{previous_status}, 'needs_review', 'RecordRequeued: previous_status needs_review');
		is(join(',', map { $_->{idempotency_key} } @{ $node->events_of($c, $p, 'ChargeAttempted') }), "$key,$key",
			'400: both attempts used the stored key');
		$requests = $emulator->stats->{requests};
		sleep 1;
		is($emulator->stats->{requests}, $requests, '400: not re-sent after the second conflict');
		my $ledger = ledger_for_key($emulator, $key);
		is(scalar(@$ledger), 1, '400: the emulator still holds only the foreign object for the key');
		is($ledger->[0]{amount}, 999, '400: (amount 999, not ours)');

		# resolve_record: a person found the charge.
		my ($ok, $out, $err) = (undef, '', '');
		($ok, $out, $err) = $node->psql('postgres', "SELECT billguard.resolve_record('$c', '$p', 'not-an-id')");
		like($err, qr/charge_id must be a Stripe id/, 'resolve_record refuses a charge id that is not pi_/ch_');
		is($node->q1("SELECT billguard.resolve_record('$c', '$p', '$foreign_id')"), 'completed',
			'resolve_record answers completed');
		is($node->record_of($c, $p), "completed|$foreign_id|1", '400: the record is completed with the resolved id');
		my $resolved = $node->events_of($c, $p, 'ReviewResolved');
		is(scalar(@$resolved), 1, 'one ReviewResolved event');
		is($resolved->[0]{charge_id}, $foreign_id, 'ReviewResolved: charge_id');
		is($resolved->[0]{previous_status}, 'needs_review', 'ReviewResolved: previous_status needs_review');
		is($node->q1("SELECT status || '|' || charge_id FROM billguard.bill_customer('$c', '$p')"),
			"already_completed|$foreign_id", '400: bill_customer answers already_completed with the resolved id');
		($ok, $out, $err) = $node->psql('postgres', "SELECT billguard.retry_record('$c', '$p')");
		like($err, qr/only failed or needs_review records can be retried/, 'retry_record refuses a completed record');
		($ok, $out, $err) = $node->psql('postgres', "SELECT billguard.resolve_record('$c', '$p', 'pi_other')");
		like($err, qr/only needs_review, failed or unknown records can be resolved/,
			'resolve_record refuses a completed record');
		is($node->record_of($c, $p), "completed|$foreign_id|1", '400: the refusals changed nothing');
	}

	# ---- 500, cached, nothing created: unknown forever, same key, no charge ----
	{
		my ($c, $p) = ('t060_500nc', '2030-02');
		my $key = $node->key_of($c, $p);
		my $replayed_before = $emulator->stats->{replayed};
		is($emulator->add_fault(kind => 'status', status => 500, count => 1, create => JSON::PP::false)->{json}{queued}, 1,
			'500 without creation: fault queued');
		is($node->bill($c, $p), 'initiated',
			'500 without creation: billing initiated');
		# Each cycle: settle delay (1 s), search (nothing), charge re-sent with
		# the same key, the cached 500 replayed, unknown again.
		ok(wait_until("three ChargeUnknown of $c", 15, sub { $node->q1("SELECT count(*) FROM billguard.journal WHERE persistence_id = 'billing-$c-$p' AND event_type = 'ChargeUnknown'") >= 3 }, interval => 0.1),
			'500 without creation: three ChargeUnknown events (two search-and-resend cycles)');
		# Stop the loop: a long settle delay keeps the record waiting.
		$node->reload_with(search_settle_delay => '1h');
		ok(wait_until("$c waiting as unknown", 5, sub { $node->q1("SELECT status = 'unknown' AND next_attempt_at > now() + interval '30 minutes' FROM billguard.billing_records WHERE customer_id = '$c'") eq 't' }),
			'500 without creation: it waits as unknown (long settle delay)');
		my $types = $node->event_types($c, $p);
		unlike($types, qr/BillingCompleted|ChargeReconciled|ReviewResolved/, '500 without creation: never completed');
		my ($status, $charge, $attempts) = split /\|/, $node->record_of($c, $p), -1;
		is("$status|$charge", 'unknown|', '500 without creation: unknown, no charge id');
		cmp_ok($attempts, '>=', 3, "500 without creation: attempts counted ($attempts)");
		is($node->q1("SELECT idempotency_key FROM billguard.billing_records WHERE customer_id = '$c'"), $key,
			'500 without creation: the record keeps its content-hash key');
		my $tried = $node->events_of($c, $p, 'ChargeAttempted');
		is(scalar(grep { $_->{idempotency_key} ne $key } @$tried), 0, '500 without creation: every attempt used the one key');
		is($tried->[0]{action}, 'charge', '500 without creation: the first attempt is a charge');
		is(scalar(grep { $_->{action} ne 'search' } @$tried[1 .. $#$tried]), 0,
			'500 without creation: every later attempt searches first');
		is(scalar(grep { $_->{http_status} != 500 } @{ $node->events_of($c, $p, 'ChargeUnknown') }), 0,
			'500 without creation: every ChargeUnknown is an HTTP 500');
		cmp_ok($emulator->stats->{replayed} - $replayed_before, '>=', 2,
			'500 without creation: the re-sent charges got the cached 500 replayed (same key, same parameters)');
		is(scalar(@{ ledger_for_key($emulator, $key) }), 0, '500 without creation: no object exists at the emulator');
		is(scalar(grep { ($_->{metadata}{customer_id} // '') eq $c || ($_->{customer} // '') eq 'cus_t060500nc' } @{ $emulator->ledger }), 0,
			'500 without creation: nothing for the customer under any key');
		is($node->bill($c, $p), 'in_progress',
			'500 without creation: bill_customer answers in_progress');
		my $requests = $emulator->stats->{requests};
		sleep 1.5;
		is($emulator->stats->{requests}, $requests, '500 without creation: quiet while waiting');
	}

	# ---- settings refused ----
	{
		my ($ok, $out, $err) = $node->psql('postgres', "ALTER SYSTEM SET billguard.api_base = 'http://example.com'");
		like($err, qr/invalid value for parameter "billguard.api_base"/, 'api_base http://example.com is refused');
		like($err, qr/loopback/, '(the detail says why)');
		($ok, $out, $err) = $node->psql('postgres', "ALTER SYSTEM SET billguard.api_base = 'https://api.stripe.com/'");
		like($err, qr/invalid value for parameter "billguard.api_base"/, 'api_base with a trailing slash is refused');
		($ok, $out, $err) = $node->psql('postgres', "ALTER SYSTEM SET billguard.api_base = 'http://127.0.0.1.example.com'");
		like($err, qr/invalid value for parameter "billguard.api_base"/, 'api_base http://127.0.0.1.example.com is refused');
		($ok, $out, $err) = $node->psql('postgres', "ALTER SYSTEM SET billguard.stripe_endpoint = '/v1/refunds'");
		like($err, qr/invalid value for parameter "billguard.stripe_endpoint"/, 'stripe_endpoint /v1/refunds is refused');
		unlike(slurp_file($node->data_dir . '/postgresql.auto.conf'), qr/example\.com|refunds|api\.stripe\.com\//,
			'nothing refused reached postgresql.auto.conf');
		($ok, $out, $err) = $node->psql('postgres', "ALTER SYSTEM SET billguard.api_base = 'http://127.0.0.1:9'");
		is($err, '', 'a loopback http api_base is accepted');
		$node->q1('ALTER SYSTEM RESET billguard.api_base');
	}

	$node->stop;
	$emulator->stop;
}
note(sprintf('group 1 took %.1f s', time - $t0));

# ============================================================================
# group 2: a 429 storm
# ============================================================================
{
	my $t = time;
	my $emulator = start_emulator(rate_limit => 20, latency_ms => 5);
	my $node = BillguardNode->dispatching('storm', $emulator,
		"billguard.max_requests_per_second = 500",
		"billguard.max_attempts = 3");    # 429s must not count towards failing
	$node->add_accounts(200, 'storm_');
	is($node->q1("SELECT initiated FROM billguard.bill_period('2030-05')"), '200', '429: 200 billings initiated');
	ok($node->wait_until_settled('2030-05', 80), '429: every record settles');
	is($node->q1("SELECT string_agg(status || '=' || n, ',') FROM (SELECT status, count(*) n FROM billguard.billing_records GROUP BY 1) s"),
		'completed=200', '429: all 200 completed, none failed');
	my $by_key = charges_by_key($emulator);
	is(scalar(keys %$by_key), 200, '429: charges for 200 distinct keys');
	is(scalar(grep { @{ $by_key->{$_} } != 1 } keys %$by_key), 0, '429: exactly one charge per key');
	my %record_charge = map { split /\|/ } split /\n/, $node->q1("SELECT idempotency_key || '|' || charge_id FROM billguard.billing_records");
	is(scalar(grep { ($record_charge{$_} // '') ne $by_key->{$_}[0] } keys %$by_key), 0,
		"429: every record carries the emulator's id for its key");
	my $stats = $emulator->stats;
	cmp_ok($stats->{rate_limited}, '>', 0, "429: the emulator rate-limited requests ($stats->{rate_limited})");
	is($stats->{created}, 200, '429: the emulator created 200 objects');
	my $max_attempts = $node->q1('SELECT max(attempts) FROM billguard.billing_records');
	note("429: max attempts of a record $max_attempts (max_attempts = 3)");
	is($node->q1(q{SELECT count(*) FROM billguard.journal WHERE event_type = 'BillingFailed' AND (event ->> 'terminal')::boolean}),
		'0', '429: no terminal BillingFailed');
	cmp_ok($node->q1(q{SELECT count(*) FROM billguard.journal WHERE event_type = 'BillingFailed' AND event ->> 'http_status' = '429'}),
		'>', 0, '429: the rate-limited attempts are journaled as non-terminal BillingFailed');
	note(sprintf('group 2 (429 storm) took %.1f s', time - $t));
	$node->stop;
	$emulator->stop;
}

# ============================================================================
# group 3: 401, a wrong key: paused, then resumed with the right key
# ============================================================================
{
	my $t = time;
	my $right_key = 'sk_test_t060RightKeyFromTheVault4242';
	my $emulator = start_emulator(api_key => $right_key, latency_ms => 5);
	# The harness writes its default key into the key file: the wrong one here.
	# A short request timeout keeps the dispatcher's lease (2 x timeout + 30 s)
	# as short as it can be. At 50 requests/s the dispatcher claims a batch
	# of 9 and sends one every 20 ms, so the first 401 (answered in about a
	# millisecond) always arrives while claimed records still wait their turn.
	my $node = BillguardNode->dispatching('auth', $emulator, "billguard.request_timeout = '1s'",
		"billguard.max_requests_per_second = 50");
	isnt($StripeEmulatorHarness::DEFAULT_API_KEY, $right_key, '401: the node starts with another key');
	$node->add_accounts(20, 'auth_');
	is($node->q1("SELECT initiated FROM billguard.bill_period('2030-06')"), '20', '401: 20 billings initiated');
	ok(wait_until('the dispatcher paused', 10, sub { $node->q1('SELECT paused FROM billguard.dispatch_status') eq 't' }),
		'401: dispatch_status shows paused');
	like($node->q1('SELECT pause_reason FROM billguard.dispatch_status'), qr/401/, '401: the pause reason names the 401');
	my $sent = $emulator->stats->{requests};
	my $claimed = $node->q1("SELECT count(*) FROM billguard.journal WHERE event_type = 'ChargeAttempted'");
	cmp_ok($claimed, '>', $sent, "401: the pause met claimed records not yet sent ($claimed claimed, $sent sent)");
	sleep 1.5;
	is($emulator->stats->{requests}, $sent, '401: nothing is sent while paused');
	is($node->q1("SELECT count(*) FROM billguard.billing_records WHERE status IN ('failed', 'needs_review', 'completed')"),
		'0', '401: no record failed (or completed)');
	is($node->q1("SELECT string_agg(status || '=' || n, ',' ORDER BY status) FROM (SELECT status, count(*) n FROM billguard.billing_records GROUP BY 1) s"),
		'pending=20', '401: all 20 records stay pending');
	is($node->q1('SELECT max(attempts) FROM billguard.billing_records'), '0', '401: refused attempts are not counted');
	diag('401: while paused: ' . $node->q1(q{
		SELECT string_agg(format('%s: %s records, attempts %s, lease ends in %s s, %s ChargeAttempted', status, n, a, l, e), '; ')
		  FROM (SELECT r.status, count(*) n, max(r.attempts) a,
		               round(max(extract(epoch FROM r.lease_expires_at - now()))) l,
		               sum((SELECT count(*) FROM billguard.journal j WHERE j.persistence_id = 'billing-' || r.customer_id || '-' || r.billing_period
		                       AND j.event_type = 'ChargeAttempted')) e
		          FROM billguard.billing_records r GROUP BY r.status) s}))
		if $node->q1("SELECT count(*) FROM billguard.billing_records WHERE status <> 'pending'") ne '0';
	is($node->q1("SELECT count(*) FROM billguard.journal WHERE event_type = 'BillingFailed'"), '0',
		'401: no BillingFailed event');
	is(scalar(@{ $emulator->ledger }), 0, '401: nothing exists at the emulator');

	# A key file that holds no Stripe key: still paused, with that reason,
	# and the file's content is never echoed.
	my $junk = 'sk_test_t060Junk!NotAKey';
	$node->set_api_key($junk);
	$node->q1('SELECT pg_reload_conf()');
	ok(wait_until('the pause reason of a key file without a key', 10, sub { $node->q1('SELECT pause_reason FROM billguard.dispatch_status') =~ /does not hold a Stripe key/ }),
		'401: a key file without a Stripe key: paused, reason "does not hold a Stripe key"');
	unlike($node->q1('SELECT pause_reason FROM billguard.dispatch_status'), qr/t060Junk/, '(the reason does not echo the file)');
	is($node->q1("SELECT count(*) FROM billguard.billing_records WHERE status <> 'pending' AND status <> 'dispatching'"), '0',
		'401: still nothing failed');

	# The right key, a reload: everything completes.
	$node->set_api_key($right_key);
	my $reloaded = time;
	$node->q1('SELECT pg_reload_conf()');
	ok($node->wait_until_settled('2030-06', 60), '401: after the right key and a reload every record settles');
	my $took = time - $reloaded;
	cmp_ok($took, '<', 10, sprintf('401: settled %.1f s after the reload (not held back by leases)', $took));
	is($node->q1("SELECT string_agg(status || '=' || n, ',') FROM (SELECT status, count(*) n FROM billguard.billing_records GROUP BY 1) s"),
		'completed=20', '401: all 20 completed');
	my $by_key = charges_by_key($emulator);
	is(scalar(keys %$by_key), 20, '401: charges for 20 distinct keys');
	is(scalar(grep { @{ $by_key->{$_} } != 1 } keys %$by_key), 0, '401: exactly one charge per key');
	is($node->q1("SELECT paused::text || '|' || coalesce(pause_reason, '') FROM billguard.dispatch_status"), 'false|',
		'401: dispatch_status no longer paused, no reason');

	# The secret never shows.
	my $log = slurp_file($node->logfile);
	like($log, qr/paused: Stripe refused the API key/, '(the server log has the pause line)');
	unlike($log, qr/\Q$right_key\E/, 'the right key never appears in the server log');
	unlike($log, qr/\Q$StripeEmulatorHarness::DEFAULT_API_KEY\E/, 'the wrong key never appears in the server log');
	unlike($log, qr/t060Junk/, 'the junk key file content never appears in the server log');
	is($node->q1("SELECT count(*) FROM pg_settings WHERE setting LIKE '%t060RightKey%' OR setting LIKE '%EmulatorHarness%'"), '0',
		'no setting holds the key text (superuser view)');
	$node->q1('CREATE ROLE t060_reader LOGIN');
	is($node->q1(q{SET ROLE t060_reader; SELECT count(*) FROM pg_settings WHERE name = 'billguard.api_key_file'}), '0',
		'a non-superuser does not see billguard.api_key_file in pg_settings');
	my ($ok, $out, $err) = $node->psql('postgres', q{SET ROLE t060_reader; SELECT current_setting('billguard.api_key_file')});
	like($err, qr/permission denied|must be superuser|privileges of pg_read_all_settings/,
		'a non-superuser cannot read billguard.api_key_file with current_setting');
	($ok, $out, $err) = $node->psql('postgres', q{SET ROLE t060_reader; SHOW billguard.api_key_file});
	like($err, qr/permission denied|must be superuser|privileges of pg_read_all_settings/,
		'a non-superuser cannot SHOW billguard.api_key_file');
	note(sprintf('group 3 (401) took %.1f s', time - $t));
	$node->stop;
	$emulator->stop;
}

note(sprintf('060 took %.1f s in all', time - $t0));
done_testing();
