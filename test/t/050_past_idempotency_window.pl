# Past Stripe's idempotency window: a record left 'dispatching' by a crash is
# re-dispatched only after the emulator has pruned its key, so re-sending the
# stored key would create a second charge. billguard must search first
# (billguard.idempotency_window) and reconcile with the charge that exists.
#
#   control   with the emulator alone: within the TTL a POST with a used key
#             is replayed; after the TTL the same POST creates a second object
#   found     Stripe committed the charge, no answer reached the worker
#             (commit_then_drop, worker held before recording by a row lock),
#             server crash, wait past the TTL, start: ChargeReconciled with the
#             original id, still exactly one charge for the key
#   absent    the record was claimed but never sent (paced), server crash,
#             wait past the window, start: the search finds nothing, the charge
#             is sent once with the stored key
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep time);
use BillguardTest;
use BillguardNode;
use DispatchScenario;

my $ttl = 3;    # seconds the emulator keeps an idempotency key
my $emulator_log = "$PostgreSQL::Test::Utils::log_path/050_emulator.log";
my $emulator = StripeEmulatorHarness->start(quiet => 0, stderr => $emulator_log,
	args => [ '--idempotency-ttl', $ttl ]);
my $node = BillguardNode->dispatching('past_window', $emulator,
	"log_line_prefix = '%m [%p] %b '",
	"billguard.idempotency_window = '1s'");
$node->add_accounts(10);

# ---- helpers (shared ones: test/lib) ---------------------------------------

# What explain_case shows of the server and emulator logs.
my @explain = (
	log_match => qr/billguard dispatcher|terminated|recovery|ready to accept|ERROR|FATAL|PANIC/,
	log_heading => 'server log (last 30 relevant lines)',
	emulator_log => $emulator_log);

# The parameters billguard sent for an object, to re-send them by hand.
sub params_of {
	my ($object) = @_;
	return StripeEmulatorHarness::payment_intent_params(
		amount => $object->{amount}, currency => $object->{currency}, customer => $object->{customer},
		payment_method => 'pm_card_visa',
		description => "billguard $object->{metadata}{customer_id} $object->{metadata}{billing_period}",
		map { ("metadata[$_]" => $object->{metadata}{$_}) } sort keys %{ $object->{metadata} });
}

# ---- control: the emulator really forgets keys after the TTL -------------------

my $control_key = 'control-050-' . $$;
my $control_params = StripeEmulatorHarness::payment_intent_params(
	'metadata[billguard_key]' => $control_key, customer => 'cus_control');
my $control_first = $emulator->post_form('/v1/payment_intents', $control_params, idempotency_key => $control_key);
is($control_first->{status}, 200, 'control: a charge with a fresh key succeeds');
my $control_again = $emulator->post_form('/v1/payment_intents', $control_params, idempotency_key => $control_key);
is($control_again->{json}{id}, $control_first->{json}{id}, 'control: within the TTL the same key is replayed');
is($control_again->{headers}{'idempotent-replayed'}, 'true', 'control: with Idempotent-Replayed: true');
my $control_created_at = time;

# ---- found: the charge exists, its key is pruned, the record is dispatching ----

my ($customer, $decoy, $period) = ('cust_000001', 'cust_000002', '2026-09');
my $key = $node->key_of($customer, $period);
my $failed = failures();

# The decoy leaves a warm keep-alive connection in the dispatcher, so the
# charge goes out on a reused connection and libcurl re-sends it by itself
# when the connection dies; two drops leave the worker with no answer at all.
is($node->bill($decoy, $period), 'initiated', 'found: decoy initiated');
ok(wait_until('decoy completed', 20, sub { $node->status_of($decoy, $period) eq 'completed' }), 'found: decoy charged');

$emulator->configure(latency_ms => 1000);
my $before = $emulator->stats;
$emulator->add_fault(kind => 'commit_then_drop', count => 2);
my $lock = start_row_lock($node, $customer, $period);
is($node->bill($customer, $period), 'initiated', 'found: billing initiated');
is(row_lock_taken($lock), 'dispatching:1', 'found: row lock taken while the first attempt is in flight');
ok(wait_until('the charge at the emulator', 15, sub { @{ succeeded_for_key($emulator, $key) } == 1 }),
	'found: the emulator committed the charge');
ok(wait_until('the answer waiting for the row lock', 15, sub { $node->answer_waits_for_row_lock($customer, $period) }),
	'found: no answer reached the worker, and it cannot record that while the row is locked');
$emulator->configure(latency_ms => 0);
my $at_crash = $emulator->stats;
is($at_crash->{faults_applied} - $before->{faults_applied}, 2, 'found: both drops took effect');
my $original = succeeded_for_key($emulator, $key);
my $original_id = @$original ? $original->[0]{id} : '(none)';
my $charged_at = time;
is($node->status_of($customer, $period), 'dispatching', 'found: the record is dispatching when the server crashes');

$node->stop('immediate');
end_row_lock($lock);

# Past the TTL: the emulator has forgotten the key.
my $pause = $charged_at + $ttl + 1.5 - time;
note(sprintf('found: waiting %.1f s for the emulator to prune the key', $pause));
sleep $pause if $pause > 0;

# The control key is older than billguard's: a POST with it now charges again.
my $control_late = $emulator->post_form('/v1/payment_intents', $control_params, idempotency_key => $control_key);
is($control_late->{status}, 200, 'control: after the TTL the POST with the used key succeeds');
isnt($control_late->{json}{id}, $control_first->{json}{id}, 'control: ... and creates a NEW object');
is(scalar(@{ succeeded_for_key($emulator, $control_key) }), 2,
	'control: the emulator now holds two succeeded charges for one key (what a naive re-send does)');
cmp_ok(time - $control_created_at, '>', $ttl, 'control: the control key is past the TTL');

my $stats_before_start = $emulator->stats;
$node->start;
ok(wait_until("$customer/$period settled", 30, sub { $node->status_of($customer, $period) eq 'completed' }),
	'found: the record is completed after the restart');
is(scalar(@{ succeeded_for_key($emulator, $key) }), 1, 'found: the emulator still holds exactly ONE succeeded charge for the key');
is(scalar(@{ ledger_for_key($emulator, $key) }), 1, 'found: and exactly one object of any status');
is($node->q1("SELECT charge_id FROM billguard.billing_records WHERE customer_id = '$customer' AND billing_period = '$period'"),
	$original_id, 'found: the record carries the original charge id');
is($node->q1(qq{SELECT string_agg((event ->> 'charge_id') || '/' || (event ->> 'via'), ',') FROM billguard.journal
	WHERE persistence_id = 'billing-$customer-$period' AND event_type = 'ChargeReconciled'}),
	"$original_id/search", 'found: one ChargeReconciled event with the original id, via search');
is($node->event_types($customer, $period, 'action', 'replayed'),
	'BillingInitiated,ChargeAttempted(charge),ChargeAttempted(search),ChargeReconciled',
	'found: journal: the interrupted charge, then a search that reconciled');
is($node->q1("SELECT billguard.entity_state('billing-$customer-$period') ->> 'status' || '/' || (billguard.entity_state('billing-$customer-$period') ->> 'charge_id')"),
	"completed/$original_id", 'found: the folded entity state is completed with the original id');
my $after = $emulator->stats;
is($after->{created} - $stats_before_start->{created}, 0, 'found: nothing was created at the emulator after the restart');
my @since = grep { m{ /v1/} } split /\n/, slurp_file($emulator_log);
note("emulator requests so far:\n" . join("\n", @since));
ok((grep { m{^GET /v1/payment_intents/search } } @since) >= 1, 'found: the dispatcher searched at the emulator');
explain_case($node, $emulator, $customer, $period, $key, @explain) if failures() > $failed;

# What the search prevented: billguard's own key and parameters, sent again
# now, make a second charge at the emulator.
my $naive = @$original
  ? $emulator->post_form('/v1/payment_intents', params_of($original->[0]), idempotency_key => $key)
  : {};
is($naive->{status} // '', 200, "control: billguard's stored key and parameters, sent again by hand, succeed");
isnt($naive->{headers}{'idempotent-replayed'} // '', 'true', 'control: ... not as a replay');
isnt($naive->{json}{id} // $original_id, $original_id,
	"control: ... but as a second charge: what a re-send without the search would have done");
is(scalar(@{ succeeded_for_key($emulator, $key) }), 2, 'control: (the emulator holds two after that naive re-send)');

# ---- absent: claimed, never sent, past the window ------------------------------

my ($customer2, $decoy2, $period2) = ('cust_000003', 'cust_000004', '2026-10');
my $key2 = $node->key_of($customer2, $period2);
$failed = failures();

# At 0.1 requests per second the row claimed after the decoy waits ~10 s.
$node->set_rate(0.1);
is($node->bill($decoy2, $period2), 'initiated', 'absent: decoy initiated');
ok(wait_until('decoy completed', 20, sub { $node->status_of($decoy2, $period2) eq 'completed' }), 'absent: decoy charged');
my $requests_before = $emulator->stats->{requests};
is($node->bill($customer2, $period2), 'initiated', 'absent: billing initiated');
ok(wait_until('claimed', 10, sub { $node->status_of($customer2, $period2) eq 'dispatching' }), 'absent: the record is claimed');
$node->set_rate(undef);
is(scalar(@{ ledger_for_key($emulator, $key2) }), 0, 'absent: the emulator has no object for the key before the crash');
is($emulator->stats->{requests}, $requests_before, 'absent: and received no request since the decoy');
$node->stop('immediate');
sleep 1.5;    # past billguard.idempotency_window (1 s) since the first dispatch
$node->start;
ok(wait_until("$customer2/$period2 settled", 30, sub { $node->status_of($customer2, $period2) eq 'completed' }),
	'absent: the record is completed after the restart');
my $charges2 = succeeded_for_key($emulator, $key2);
is(scalar(@$charges2), 1, 'absent: exactly one succeeded charge for the key');
is($node->q1("SELECT charge_id FROM billguard.billing_records WHERE customer_id = '$customer2' AND billing_period = '$period2'"),
	(@$charges2 ? $charges2->[0]{id} : '(none)'), 'absent: the record carries its id');
is($charges2->[0]{idempotency_key} // '', $key2, 'absent: sent with the stored key');
is($node->event_types($customer2, $period2, 'action', 'replayed'),
	'BillingInitiated,ChargeAttempted(charge),ChargeAttempted(search),BillingCompleted(false)',
	'absent: journal: claim, crash, search found nothing, one charge');
explain_case($node, $emulator, $customer2, $period2, $key2, @explain) if failures() > $failed;

# ---- nobody else was charged twice ----------------------------------------------

my $by_key = charges_by_key($emulator);
my @doubles = grep { $_ ne $key && $_ ne $control_key && @{ $by_key->{$_} } != 1 } sort keys %$by_key;
is(join(',', @doubles), '', 'no other key has more than one succeeded charge');
is($node->q1(q{SELECT string_agg(status || '=' || n, ',') FROM
	(SELECT status, count(*) n FROM billguard.billing_records GROUP BY 1 ORDER BY 1) s}),
	'completed=4', 'all four records completed');

$node->stop;
$emulator->stop;
done_testing();
